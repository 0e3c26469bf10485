// test_slurm_target.cpp — `airhost submit --to slurm`: the batch script from the [slurm] table
// and the flags, and the table's own errors with file:line:column.
#include <doctest/doctest.h>

#include <string>

#include "base/errors.hpp"
#include "cli/config.hpp"
#include "cli/slurm_target.hpp"

using namespace airhost::detail;

TEST_CASE("the batch script runs one airhost per node with every [slurm] setting as an #SBATCH line") {
  BatchJob job;
  job.run_id = "20261205-010203-abcdef";
  job.runs_root = "/shared/runs";
  job.run_dir = "/shared/runs/20261205-010203-abcdef";
  job.working_dir = "/home/me/it's here";
  job.airhost = "/opt/venv/bin/airhost";
  job.launch = {"train.py", "-n", "8", "--", "--lr", "0.1 0.2"};
  job.nodes = 2;
  job.join_token_file = "/shared/runs/20261205-010203-abcdef/join.token";
  job.slurm = parse_config("[slurm]\npartition = \"gpu\"\ntime = \"24:00:00\"\ngpus_per_node = 8\ncpus_per_task = 64\n"
                           "mem = \"256G\"\nconstraint = \"h100\"\naccount = \"ml\"\nqos = \"high\"\nextra = [\"--exclusive\"]\n",
                           "airhost.toml")
                  .slurm;
  const std::string s = render_batch_script(job);
  CHECK(s.rfind("#!/bin/bash\n", 0) == 0);
  for (const char* line : {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=1\n",
                           "#SBATCH --output=/shared/runs/20261205-010203-abcdef/slurm-%j.out\n",
                           "#SBATCH --partition=gpu\n", "#SBATCH --account=ml\n", "#SBATCH --qos=high\n",
                           "#SBATCH --time=24:00:00\n", "#SBATCH --gpus-per-node=8\n", "#SBATCH --cpus-per-task=64\n",
                           "#SBATCH --mem=256G\n", "#SBATCH --constraint=h100\n", "#SBATCH --exclusive\n",
                           "cd '/home/me/it'\\''s here'\n", "export AIRHOST_RUNS_DIR='/shared/runs'\n",
                           "export AIRHOST_SUBMIT_RUN_ID='20261205-010203-abcdef'\n",
                           "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" \\\n"
                           "  '/opt/venv/bin/airhost' 'train.py' '-n' '8' '--join-token-file' "
                           "'/shared/runs/20261205-010203-abcdef/join.token' '--' '--lr' '0.1 0.2'\n"})
    CHECK_MESSAGE(s.find(line) != std::string::npos, line);
  // Every #SBATCH line comes before the first command: sbatch reads no further.
  CHECK(s.rfind("#SBATCH") < s.find("set -euo pipefail"));

  // A launch without script arguments gets the token file at its end; one that names its own
  // token file keeps it.
  job.launch = {"train.py"};
  CHECK(render_batch_script(job).find("'train.py' '--join-token-file' '/shared/runs/") != std::string::npos);
  job.launch = {"train.py", "--join-token-file", "/secrets/t"};
  CHECK(render_batch_script(job).find("join.token") == std::string::npos);

  job.launch = {"train.py", "-n", "8", "--", "--lr", "0.1 0.2"};
  job.nodes = 1;
  job.join_token_file.clear();
  job.slurm = {};
  const std::string plain = render_batch_script(job);
  CHECK(plain.find("--partition") == std::string::npos);
  CHECK(plain.find("join-token") == std::string::npos);  // one node joins no one
  CHECK(plain.find("srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n") != std::string::npos);
}

TEST_CASE("flags over the file: given fields win, extra lines add up") {
  SlurmSettings file = parse_config("[slurm]\npartition = \"cpu\"\ntime = \"1:00:00\"\nextra = [\"--exclusive\"]\n", "f").slurm;
  SlurmSettings flags;
  flags.partition = "gpu";
  flags.extra = {"--mail-type=END"};
  file.merge(flags);
  CHECK(*file.partition == "gpu");
  CHECK(*file.time == "1:00:00");
  CHECK(file.extra == std::vector<std::string>{"--exclusive", "--mail-type=END"});
}

TEST_CASE("a [slurm] key that does not exist, or a value of the wrong kind, is one sentence with file:line:column") {
  CHECK_THROWS_WITH_AS(parse_config("[slurm]\npartitoin = \"gpu\"\n", "airhost.toml"),
                       "airhost.toml:2:1: unknown key 'slurm.partitoin' (did you mean 'partition'?); see "
                       "configs/default.toml for every key",
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_config("[slurm]\ngpus_per_node = \"8\"\n", "airhost.toml"),
                       "airhost.toml:2:17: key 'slurm.gpus_per_node' must be a non-negative integer, got a string; e.g. "
                       "gpus_per_node = 8",
                       ConfigError);
  CHECK_THROWS_AS(parse_config("[slurm]\npartition = \"\"\n", "airhost.toml"), ConfigError);
  CHECK_THROWS_AS(parse_config("[slurm]\nextra = [\"--a\\n--b\"]\n", "airhost.toml"), ConfigError);
}

TEST_CASE("the warning before the time limit: USR1@90 by default, chosen, or off; --requeue and its variable") {
  BatchJob job;
  job.run_id = "r";
  job.runs_root = "/shared/runs";
  job.run_dir = "/shared/runs/r";
  job.working_dir = "/w";
  job.airhost = "/bin/airhost";
  job.launch = {"train.py"};
  const std::string plain = render_batch_script(job);
  CHECK(plain.find("#SBATCH --signal=USR1@90\n") != std::string::npos);
  CHECK(plain.find("#SBATCH --open-mode=append\n") != std::string::npos);  // a requeued job's output goes on
  CHECK(plain.find("--requeue") == std::string::npos);
  CHECK(plain.find("AIRHOST_REQUEUE") == std::string::npos);

  job.slurm = parse_config("[slurm]\nsignal = \"USR2@300\"\nrequeue = true\n", "airhost.toml").slurm;
  const std::string chosen = render_batch_script(job);
  CHECK(chosen.find("#SBATCH --signal=USR2@300\n") != std::string::npos);
  CHECK(chosen.find("#SBATCH --requeue\n") != std::string::npos);
  CHECK(chosen.find("export AIRHOST_REQUEUE=1") != std::string::npos);
  CHECK(chosen.rfind("#SBATCH") < chosen.find("set -euo pipefail"));

  job.slurm = parse_config("[slurm]\nsignal = \"off\"\n", "airhost.toml").slurm;
  CHECK(render_batch_script(job).find("--signal") == std::string::npos);

  CHECK_THROWS_WITH_AS(parse_config("[slurm]\nsignal = \"TERM@90\"\n", "airhost.toml"),
                       "airhost.toml:2:10: slurm.signal takes USR1 or USR2, '@' and the seconds before the time limit, "
                       "or off; got 'TERM@90'; e.g. USR1@90 (airhost passes SIGUSR1 and SIGUSR2 to every rank)",
                       ConfigError);
  CHECK_THROWS_AS(checked_warning_signal("USR1", "--signal"), ConfigError);
  CHECK_THROWS_AS(checked_warning_signal("USR1@0", "--signal"), ConfigError);
  CHECK(checked_warning_signal("USR1@120", "--signal") == "USR1@120");
}
