// Slurm host lists, Slurm and Kubeflow environments → topology, and flags over detection.
#include <doctest/doctest.h>

#include "cli/command_line.hpp"
#include "cli/cluster_env.hpp"

using namespace airhost::detail;

using Hosts = std::vector<std::string>;

TEST_CASE("Slurm host lists expand as scontrol show hostnames does") {
  CHECK(expand_slurm_hostlist("gpu01") == Hosts{"gpu01"});
  CHECK(expand_slurm_hostlist("gpu[01-04,07]") == Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"});
  CHECK(expand_slurm_hostlist("n[9-11]") == Hosts{"n9", "n10", "n11"});          // no padding
  CHECK(expand_slurm_hostlist("a[009-011]") == Hosts{"a009", "a010", "a011"});   // padding kept
  CHECK(expand_slurm_hostlist("a[01-3]") == Hosts{"a01", "a02", "a03"});         // LOW's width
  CHECK(expand_slurm_hostlist("a[1-03]") == Hosts{"a1", "a2", "a3"});
  CHECK(expand_slurm_hostlist("a[1-2,4-5]") == Hosts{"a1", "a2", "a4", "a5"});
  CHECK(expand_slurm_hostlist("a[1-2]-b[3-4]") == Hosts{"a1-b3", "a1-b4", "a2-b3", "a2-b4"});
  CHECK(expand_slurm_hostlist("a[1-2][3-4]") == Hosts{"a13", "a14", "a23", "a24"});
  CHECK(expand_slurm_hostlist("gpu[01-02,10],login,cpu[7]") == Hosts{"gpu01", "gpu02", "gpu10", "login", "cpu7"});
  CHECK(expand_slurm_hostlist("a,,b") == Hosts{"a", "b"});  // Slurm skips empty entries too
  CHECK(expand_slurm_hostlist("a1-b2") == Hosts{"a1-b2"});  // a dash outside brackets is text
  CHECK(expand_slurm_hostlist("n[1-2].cluster") == Hosts{"n1.cluster", "n2.cluster"});
  CHECK(expand_slurm_hostlist("node[1-2],node[1-2]") == Hosts{"node1", "node2", "node1", "node2"});
}

TEST_CASE("a Slurm host list that does not parse says what is wrong with it") {
  const std::string tail = "; expected host names and bracket ranges like gpu[01-04,07]";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "cannot read the Slurm node list '': it names no host"},
      {",", "cannot read the Slurm node list ',': it names no host"},
      {"gpu[01-04", "cannot read the Slurm node list 'gpu[01-04': the '[' at character 4 is never closed"},
      {"gpu[3-1]", "cannot read the Slurm node list 'gpu[3-1]': range '3-1' goes backwards (1 < 3)"},
      {"gpu[]", "cannot read the Slurm node list 'gpu[]': empty brackets []"},
      {"gpu[1-2]]", "cannot read the Slurm node list 'gpu[1-2]]': a ']' without its '[' in 'gpu[1-2]]'"},
      {"gpu[x-y]", "cannot read the Slurm node list 'gpu[x-y]': range 'x-y' is not NUMBER or LOW-HIGH"},
      {"gpu[1-]", "cannot read the Slurm node list 'gpu[1-]': range '1-' is not NUMBER or LOW-HIGH"},
      {"gpu[1-3,]", "cannot read the Slurm node list 'gpu[1-3,]': an empty range in [1-3,]"},
      {"gpu[[1]]", "cannot read the Slurm node list 'gpu[[1]]': brackets inside brackets"},
      {"a[0-99999],b[0-9]", "cannot read the Slurm node list 'a[0-99999],b[0-9]': more than 100000 hosts"},
      {"a b", "cannot read the Slurm node list 'a b': host name 'a b' contains white space"},
  };
  for (const auto& [list, message] : cases) {
    CAPTURE(list);
    CHECK_THROWS_WITH_AS(expand_slurm_hostlist(list), (message + tail).c_str(), ConfigError);
  }
}

TEST_CASE("Slurm's tasks per node expand, and bad ones are refused") {
  CHECK(expand_slurm_tasks_per_node("1") == std::vector<int>{1});
  CHECK(expand_slurm_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_slurm_tasks_per_node("1(x2)") == std::vector<int>{1, 1});
  for (const char* bad : {"", "x", "2(x)", "2(3)", "2(x3", "1,", "-1"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(expand_slurm_tasks_per_node(bad), ConfigError);
  }
}

namespace {

// What srun --nodes=2 --ntasks-per-node=1 gives the task on the second node of job 4242.
EnvMap slurm_step(int nodeid = 1) {
  return {{"SLURM_JOB_ID", "4242"},         {"SLURM_STEP_ID", "0"},
          {"SLURM_NNODES", "2"},            {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},    {"SLURM_NODEID", std::to_string(nodeid)},
          {"SLURM_LOCALID", "0"},           {"SLURM_PROCID", std::to_string(nodeid)},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_GPUS_ON_NODE", "8"},      {"PATH", "/usr/bin"}};
}

}  // namespace

TEST_CASE("srun --ntasks-per-node=1 airhost: the topology comes from Slurm") {
  const auto t = detect_cluster(slurm_step());
  CHECK(t.source == "slurm");
  CHECK(t.evidence == "SLURM_JOB_ID=4242");
  CHECK(t.nnodes == 2);
  CHECK(t.node_rank == 1);
  CHECK(t.master_addr == "gpu07");
  CHECK(t.master_port == 20000 + 4242);
  CHECK(t.accelerators == 8);
  CHECK(t.why.at("nnodes") == "SLURM_STEP_NUM_NODES=2");
  CHECK(t.why.at("node_rank") == "SLURM_NODEID=1");
  CHECK(t.why.at("master_addr") == "first host of SLURM_STEP_NODELIST=gpu[07-08]");
  CHECK(t.why.at("master_port") == "20000 + SLURM_JOB_ID % 10000 (SLURM_JOB_ID=4242)");
  CHECK(t.why.at("accelerators") == "SLURM_GPUS_ON_NODE=8");

  SUBCASE("a step on fewer nodes than the job counts its own") {
    auto env = slurm_step(0);
    env["SLURM_JOB_NUM_NODES"] = "4";
    env["SLURM_JOB_NODELIST"] = "gpu[01-04]";
    const auto s = detect_cluster(env);
    CHECK(s.nnodes == 2);
    CHECK(s.master_addr == "gpu07");
  }
  SUBCASE("MASTER_ADDR and MASTER_PORT in the job's environment win over the derived ones") {
    auto env = slurm_step();
    env["MASTER_ADDR"] = "10.1.1.1";
    env["MASTER_PORT"] = "29400";
    const auto s = detect_cluster(env);
    CHECK(s.master_addr == "10.1.1.1");
    CHECK(s.master_port == 29400);
    CHECK(s.why.at("master_port") == "MASTER_PORT=29400 (set in the job's environment)");
  }
  SUBCASE("the port repeats only every 10000 job ids") {
    auto env = slurm_step();
    env["SLURM_JOB_ID"] = "1234567";
    CHECK(detect_cluster(env).master_port == 24567);
  }
  SUBCASE("a job without GPUs leaves the rank count to airhost") {
    auto env = slurm_step();
    env.erase("SLURM_GPUS_ON_NODE");
    CHECK_FALSE(detect_cluster(env).accelerators);
    env["SLURM_GPUS_ON_NODE"] = "0";
    CHECK_FALSE(detect_cluster(env).accelerators);
  }
}

TEST_CASE("a one-node Slurm job keeps its rendezvous on the node") {
  EnvMap env = {{"SLURM_JOB_ID", "7"},          {"SLURM_STEP_ID", "0"},         {"SLURM_NNODES", "1"},
                {"SLURM_STEP_NUM_NODES", "1"},  {"SLURM_NODEID", "0"},          {"SLURM_LOCALID", "0"},
                {"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_JOB_NODELIST", "localhost"},
                {"SLURM_STEP_TASKS_PER_NODE", "1"}};
  const auto t = detect_cluster(env);
  CHECK(t.source == "slurm");
  CHECK(t.nnodes == 1);
  CHECK(t.node_rank == 0);
  CHECK_FALSE(t.master_addr);
  CHECK_FALSE(t.master_port);
  REQUIRE(t.notes.size() == 1);
  CHECK(t.notes[0].find("one node") != std::string::npos);
  SUBCASE("the batch script of a one-node job is fine too") {
    env.erase("SLURM_STEP_ID");
    CHECK(detect_cluster(env).nnodes == 1);
  }
  SUBCASE("a bad node list is said even on one node") {
    env["SLURM_STEP_NODELIST"] = "gpu[1-";
    CHECK_THROWS_WITH_AS(detect_cluster(env),
                         "cannot read the Slurm node list 'gpu[1-': the '[' at character 4 is never closed; expected "
                         "host names and bracket ranges like gpu[01-04,07]",
                         ConfigError);
  }
}

TEST_CASE("several airhosts on one Slurm node are refused, saying to use one task per node") {
  const std::string fix = "airhost starts every rank of its node itself, so Slurm must run exactly one airhost per "
                          "node: srun --ntasks-per-node=1 airhost train.py (and #SBATCH --ntasks-per-node=1)";
  SUBCASE("srun --ntasks-per-node=8: every task of the step sees the layout") {
    auto env = slurm_step();
    env["SLURM_STEP_TASKS_PER_NODE"] = "8(x2)";
    CHECK_THROWS_WITH_AS(detect_cluster(env),
                         ("this Slurm step runs 8 tasks on a node (SLURM_STEP_TASKS_PER_NODE=8(x2)); " + fix).c_str(),
                         ConfigError);
  }
  SUBCASE("without the layout, a task other than the first of its node") {
    auto env = slurm_step();
    env.erase("SLURM_STEP_TASKS_PER_NODE");
    env["SLURM_LOCALID"] = "3";
    CHECK_THROWS_WITH_AS(detect_cluster(env), ("this is task 3 of its node (SLURM_LOCALID=3); " + fix).c_str(),
                         ConfigError);
  }
  SUBCASE("#SBATCH --ntasks-per-node=8 then srun --ntasks-per-node=1 is right") {
    auto env = slurm_step();
    env["SLURM_NTASKS_PER_NODE"] = "8";  // inherited from the batch script
    CHECK(detect_cluster(env).nnodes == 2);
  }
}

TEST_CASE("a multi-node allocation used outside srun is refused") {
  auto env = slurm_step(0);
  env.erase("SLURM_STEP_ID");
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  CHECK_THROWS_WITH_AS(detect_cluster(env),
                       "airhost is running in a 2-node Slurm allocation but outside srun (SLURM_STEP_ID is not set), "
                       "so the other nodes would never join; start it on every node with srun --ntasks-per-node=1 "
                       "airhost train.py",
                       ConfigError);
  env["SLURM_STEP_ID"] = "4294967291";  // the batch step's id, as some versions set it
  CHECK_THROWS_AS(detect_cluster(env), ConfigError);
}

TEST_CASE("bad Slurm values are named") {
  auto env = slurm_step();
  env["SLURM_NODEID"] = "one";
  CHECK_THROWS_WITH_AS(detect_cluster(env),
                       "SLURM_NODEID='one' in the environment is not a non-negative integer; fix or unset it, or give "
                       "the value as a flag",
                       ConfigError);
  env = slurm_step();
  env["SLURM_NODEID"] = "2";
  CHECK_THROWS_WITH_AS(detect_cluster(env), "SLURM_NODEID=2 is not below the node count (SLURM_STEP_NUM_NODES=2)",
                       ConfigError);
  env = slurm_step();
  env["MASTER_PORT"] = "70000";
  CHECK_THROWS_WITH_AS(detect_cluster(env),
                       "MASTER_PORT=70000 in the environment is not a port from 1 to 65535", ConfigError);
}

namespace {

// A pod of a PyTorchJob (training operator v1.7+) with a Master and 3 Workers, nprocPerNode 4:
// what envvar.go and master.go set, for worker index 1 (RANK 2).
EnvMap pytorchjob_worker() {
  return {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"PYTHONUNBUFFERED", "1"},
          {"MASTER_ADDR", "mnist-master-0"},        {"PET_MASTER_ADDR", "mnist-master-0"},
          {"MASTER_PORT", "23456"},                 {"PET_MASTER_PORT", "23456"},
          {"WORLD_SIZE", "16"},                     {"RANK", "2"},
          {"PET_NODE_RANK", "2"},                   {"PET_NPROC_PER_NODE", "4"},
          {"PET_NNODES", "4"}};
}

}  // namespace

TEST_CASE("a Kubeflow PyTorchJob pod: the topology comes from PET_*") {
  const auto t = detect_cluster(pytorchjob_worker());
  CHECK(t.source == "kubernetes");
  CHECK(t.evidence == "PET_NNODES=4 and KUBERNETES_SERVICE_HOST");
  CHECK(t.nnodes == 4);
  CHECK(t.node_rank == 2);
  CHECK(t.master_addr == "mnist-master-0");
  CHECK(t.master_port == 23456);
  CHECK(t.accelerators == 4);
  CHECK(t.why.at("nnodes") == "PET_NNODES=4");
  CHECK(t.why.at("master_addr") == "PET_MASTER_ADDR=mnist-master-0");
  // WORLD_SIZE counts processes (4 nodes x 4): never taken for the node count.
  REQUIRE(t.notes.size() == 1);
  CHECK(t.notes[0].find("WORLD_SIZE=16 is ignored") == 0);

  SUBCASE("nprocPerNode auto (the operator's default) leaves airhost's own rank count") {
    auto env = pytorchjob_worker();
    env["PET_NPROC_PER_NODE"] = "auto";
    env["WORLD_SIZE"] = "4";
    const auto s = detect_cluster(env);
    CHECK_FALSE(s.accelerators);
    CHECK(s.notes[0] == "PET_NPROC_PER_NODE=auto: airhost's default, one rank per visible GPU (1 without GPUs)");
  }
  SUBCASE("Kubeflow Trainer v2 sets only PET_*") {
    EnvMap env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "auto"},
                  {"PET_NODE_RANK", "1"}, {"PET_MASTER_ADDR", "job-node-0-0.job"}, {"PET_MASTER_PORT", "29500"}};
    const auto s = detect_cluster(env);
    CHECK(s.source == "kubernetes");
    CHECK(s.nnodes == 2);
    CHECK(s.node_rank == 1);
    CHECK(s.master_addr == "job-node-0-0.job");
    CHECK(s.master_port == 29500);
  }
  SUBCASE("an elastic policy with min = max is a fixed count") {
    auto env = pytorchjob_worker();
    env["PET_NNODES"] = "4:4";
    CHECK(detect_cluster(env).nnodes == 4);
  }
  SUBCASE("an elastic policy's range is an elastic job (#35)") {
    auto env = pytorchjob_worker();
    env["PET_NNODES"] = "2:4";
    const auto t = detect_cluster(env);
    CHECK(t.nnodes == 4);
    CHECK(t.nnodes_min == 2);
    CHECK(t.node_rank == 2);
  }
  SUBCASE("a range that is no range is refused, naming it") {
    auto env = pytorchjob_worker();
    for (const char* text : {"4:2", "0:2", "2:", "a:b"}) {
      env["PET_NNODES"] = text;
      CHECK_THROWS_WITH_AS(detect_cluster(env),
                           ("PET_NNODES='" + std::string(text) + "' in the environment is not N or MIN:MAX (1 <= MIN <= MAX)").c_str(),
                           ConfigError);
    }
  }
  SUBCASE("several nodes without a node rank are refused") {
    auto env = pytorchjob_worker();
    env.erase("PET_NODE_RANK");
    CHECK_THROWS_WITH_AS(detect_cluster(env),
                         "PET_NNODES=4 but PET_NODE_RANK is not set, so airhost cannot tell which node this is; use a "
                         "PyTorchJob with a Master replica (it sets PET_NODE_RANK), or give --node-rank",
                         ConfigError);
  }
}

TEST_CASE("a PyTorchJob of an operator before v1.7: WORLD_SIZE counts the pods") {
  EnvMap env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"MASTER_ADDR", "mnist-master-0"},
                {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "3"}, {"RANK", "1"}};
  const auto t = detect_cluster(env);
  CHECK(t.source == "kubernetes");
  CHECK(t.nnodes == 3);
  CHECK(t.node_rank == 1);
  CHECK(t.master_addr == "mnist-master-0");
  CHECK(t.master_port == 23456);
  CHECK(t.why.at("nnodes") == "WORLD_SIZE=3 (the job's replicas)");
  SUBCASE("but not in a launcher's worker, whose WORLD_SIZE counts processes") {
    env["LOCAL_RANK"] = "0";
    CHECK(detect_cluster(env).source.empty());
  }
  SUBCASE("and not outside Kubernetes") {
    env.erase("KUBERNETES_SERVICE_HOST");
    CHECK(detect_cluster(env).source.empty());
  }
}

TEST_CASE("PET_* exported by hand, as for torchrun") {
  EnvMap env = {{"PET_NNODES", "2"}, {"PET_NODE_RANK", "0"}, {"PET_MASTER_ADDR", "10.0.0.5"},
                {"PET_MASTER_PORT", "1234"}, {"PET_NPROC_PER_NODE", "2"}};
  const auto t = detect_cluster(env);
  CHECK(t.source == "torchrun-style env");
  CHECK(t.evidence == "PET_NNODES=2");
  CHECK(t.nnodes == 2);
  CHECK(t.master_port == 1234);
  CHECK(t.accelerators == 2);
  env.erase("PET_MASTER_PORT");
  CHECK_THROWS_WITH_AS(detect_cluster(env),
                       "PET_NNODES=2 but neither PET_MASTER_PORT nor MASTER_PORT is set; give --master-port",
                       ConfigError);
}

TEST_CASE("no cluster, or detection turned off") {
  CHECK(detect_cluster({{"PATH", "/bin"}, {"MASTER_ADDR", "x"}, {"WORLD_SIZE", "2"}, {"RANK", "0"}}).source.empty());
  auto env = slurm_step();
  env["AIRHOST_DETECT"] = "0";
  const auto t = detect_cluster(env);
  CHECK(t.source.empty());
  CHECK_FALSE(t.nnodes);
  CHECK(t.notes == std::vector<std::string>{"AIRHOST_DETECT=0: Slurm and Kubernetes variables are not read"});
}

TEST_CASE("flags win over the config file, which wins over detection, which wins over defaults") {
  const auto t = detect_cluster(slurm_step());
  Settings flags, file;
  flags.master_addr = "10.9.9.9";
  file.master_port = 29999;
  file.nnodes = 2;
  Settings merged = file;
  merged.merge(flags);
  const auto r = resolve_cluster(flags, merged, "airhost.toml", t);
  CHECK(r.settings.master_addr == "10.9.9.9");
  CHECK(r.origin.at("master_addr") == "flag");
  CHECK(r.settings.master_port == 29999);
  CHECK(r.origin.at("master_port") == "config airhost.toml");
  CHECK(r.settings.nnodes == 2);
  CHECK(r.origin.at("nnodes") == "config airhost.toml");
  CHECK(r.settings.node_rank == 1);
  CHECK(r.origin.at("node_rank") == "slurm: SLURM_NODEID=1");
  CHECK(r.settings.accelerators == 8);
  CHECK(r.origin.at("accelerators") == "slurm: SLURM_GPUS_ON_NODE=8");

  SUBCASE("a flag for the node rank wins too") {
    Settings f;
    f.node_rank = 0;
    f.nnodes = 1;
    const auto q = resolve_cluster(f, f, "", t);
    CHECK(q.settings.node_rank == 0);
    CHECK(q.settings.nnodes == 1);
    CHECK(q.origin.at("node_rank") == "flag");
  }
  SUBCASE("0 means automatic for the port and the rank count, so detection still chooses") {
    Settings f;
    f.master_port = 0;
    f.accelerators = 0;
    const auto q = resolve_cluster(f, f, "", t);
    CHECK(q.settings.master_port == 24242);
    CHECK(q.settings.accelerators == 8);
  }
  SUBCASE("nothing detected: the defaults") {
    const auto q = resolve_cluster({}, {}, "", detect_cluster({}));
    CHECK_FALSE(q.settings.nnodes);
    CHECK_FALSE(q.settings.master_addr);
    for (const char* name : {"nnodes", "node_rank", "master_addr", "master_port", "accelerators"})
      CHECK(q.origin.at(name) == "default");
  }
}

TEST_CASE("an elastic job in a Slurm step takes the step's node count as MAX, and one below MIN is refused") {
  auto env = slurm_step();  // SLURM_STEP_NUM_NODES=2
  const auto t = detect_cluster(env);
  Settings f;
  f.nnodes = 4;
  f.nnodes_min = 2;
  const auto r = resolve_cluster(f, f, "", t);
  CHECK(r.settings.nnodes == 2);
  CHECK(r.settings.nnodes_min == 2);
  CHECK(r.origin.at("nnodes") == "flag; MAX 2 from slurm: SLURM_STEP_NUM_NODES=2");
  f.nnodes_min = 3;
  CHECK_THROWS_WITH_AS(resolve_cluster(f, f, "", t),
                       "--nnodes 3:4 needs at least 3 nodes, but this Slurm step has 2 (SLURM_STEP_NUM_NODES=2): ask "
                       "srun for them (srun --nodes 3-4)",
                       ConfigError);
  Settings fixed;
  fixed.nnodes = 4;  // a fixed count is the user's to keep: node 0 waits for the nodes it names
  CHECK(resolve_cluster(fixed, fixed, "", t).settings.nnodes == 4);
}

TEST_CASE("--print-env needs no target, keeps the flags apart, and is refused with a subcommand") {
  const auto o = parse_command_line({"airhost", "--print-env", "--master-addr", "10.0.0.1"}, "/nonexistent");
  CHECK(o.print_env);
  CHECK(o.command == Command::run);
  CHECK(o.flags.master_addr == "10.0.0.1");
  CHECK_FALSE(o.flags.accelerators);
  CHECK(parse_command_line({"airhost", "train.py", "--print-env"}, "/nonexistent").entry.target == "train.py");
  CHECK_THROWS_WITH_AS(parse_command_line({"airhost", "doctor", "--print-env"}, "/nonexistent"),
                       "--print-env describes a launch; drop it, or run airhost --print-env [train.py]", ConfigError);
  CHECK(usage_text().find("--print-env") != std::string::npos);
}
