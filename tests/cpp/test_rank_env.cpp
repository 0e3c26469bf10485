#include <doctest/doctest.h>

#include <map>

#include "launch/rank/rank_env.hpp"

using namespace airhost;
using namespace airhost::detail;

namespace {
std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const auto& kv : env) {
    auto eq = kv.find('=');
    CHECK(m.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second);  // no key twice
  }
  return m;
}
}  // namespace

TEST_CASE("a rank gets torchrun's variables with its own rank") {
  LaunchSpec spec;
  spec.nprocs = 4;
  spec.nnodes = 2;
  spec.node_rank = 1;
  spec.master_addr = "10.0.0.1";
  RunContext ctx{"run-1", "/runs/run-1", 29555, 4242, 3};
  auto env = as_map(build_rank_env(spec, 2, ctx, {"PATH=/bin"}));
  CHECK(env["RANK"] == "6");
  CHECK(env["LOCAL_RANK"] == "2");
  CHECK(env["WORLD_SIZE"] == "8");
  CHECK(env["LOCAL_WORLD_SIZE"] == "4");
  CHECK(env["GROUP_RANK"] == "1");
  CHECK(env["ROLE_RANK"] == "6");
  CHECK(env["ROLE_WORLD_SIZE"] == "8");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "29555");
  CHECK(env["TORCHELASTIC_RUN_ID"] == "run-1");
  CHECK(env["AIRHOST_RUN_ID"] == "run-1");
  CHECK(env["AIRHOST_RUN_DIR"] == "/runs/run-1");
  CHECK(env["AIRHOST_HOST_PID"] == "4242");
  CHECK(env["AIRHOST_CONTROL_FD"] == "3");
  CHECK(env["PYTHONUNBUFFERED"] == "1");
  CHECK(env["PATH"] == "/bin");
  CHECK(env.count("CUDA_VISIBLE_DEVICES") == 0);
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "0");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
}

TEST_CASE("a caller that is itself a torchrun worker does not pass its agent store on") {
  LaunchSpec spec;
  RunContext ctx{"r", "/d", 1, 1, 3};
  auto env = as_map(build_rank_env(spec, 0, ctx, {"TORCHELASTIC_USE_AGENT_STORE=True",
                                                  "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}));
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3");  // the caller's choice stands
}

TEST_CASE("a restarted group's ranks see the restart count and the most restarts allowed") {
  LaunchSpec spec;
  spec.nprocs = 2;
  spec.max_restarts = 5;
  RunContext ctx{"run-1", "/runs/run-1", 29555, 4242, 3, 2};
  auto env = as_map(build_rank_env(spec, 1, ctx, {"TORCHELASTIC_RESTART_COUNT=9"}));
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "5");
}

TEST_CASE("OMP_NUM_THREADS defaults to 1 but the caller's value wins") {
  LaunchSpec spec;
  RunContext ctx{"r", "/d", 1, 1, 3};
  CHECK(as_map(build_rank_env(spec, 0, ctx, {}))["OMP_NUM_THREADS"] == "1");
  CHECK(as_map(build_rank_env(spec, 0, ctx, {"OMP_NUM_THREADS=8"}))["OMP_NUM_THREADS"] == "8");
}

TEST_CASE("the caller cannot spoof a rank variable, but explicit spec.env overrides anything") {
  LaunchSpec spec;
  spec.nprocs = 2;
  RunContext ctx{"r", "/d", 1, 1, 3};
  auto env = as_map(build_rank_env(spec, 1, ctx, {"RANK=99", "FOO=caller"}));
  CHECK(env["RANK"] == "1");
  spec.env = {{"FOO", "explicit"}, {"NCCL_DEBUG", "INFO"}};
  env = as_map(build_rank_env(spec, 1, ctx, {"FOO=caller"}));
  CHECK(env["FOO"] == "explicit");
  CHECK(env["NCCL_DEBUG"] == "INFO");
}

TEST_CASE("GPU ranks see the run's devices in PCI order") {
  LaunchSpec spec;
  spec.nprocs = 2;
  spec.devices = {2, 5};
  RunContext ctx{"r", "/d", 1, 1, 3};
  auto env = as_map(build_rank_env(spec, 1, ctx, {}));
  CHECK(env["CUDA_VISIBLE_DEVICES"] == "2,5");
  CHECK(env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID");
}

TEST_CASE("GPU ranks get NCCL's flight recorder, dumping into the run directory, unless the user chose") {
  LaunchSpec spec;
  spec.nprocs = 2;
  spec.devices = {0, 1};
  RunContext ctx{"r", "/runs/r", 1, 1, 3};
  auto env = as_map(build_rank_env(spec, 1, ctx, {}));
  CHECK(env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000");
  CHECK(env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1");
  CHECK(env["TORCH_FR_DUMP_TEMP_FILE"] == "/runs/r/stacks/nccl-trace-rank-");
  CHECK(env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/runs/r/stacks/nccl-trace-rank-");

  // The user's own settings, under either of torch's names, are left alone.
  env = as_map(build_rank_env(spec, 1, ctx,
                              {"TORCH_FR_BUFFER_SIZE=50", "TORCH_NCCL_DUMP_ON_TIMEOUT=0",
                               "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/mine/fr_", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/mine/p_"}));
  CHECK(env.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 0);
  CHECK(env["TORCH_FR_BUFFER_SIZE"] == "50");
  CHECK(env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0");
  CHECK(env.count("TORCH_FR_DUMP_TEMP_FILE") == 0);
  CHECK(env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/mine/p_");
  env = as_map(build_rank_env(spec, 0, ctx, {"TORCH_NCCL_TRACE_BUFFER_SIZE=0"}));
  CHECK(env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0");  // 0 turns it off, as in torch

  // CPU ranks (gloo) are not given it.
  spec.devices.clear();
  env = as_map(build_rank_env(spec, 0, ctx, {}));
  CHECK(env.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 0);
  CHECK(env.count("TORCH_FR_DUMP_TEMP_FILE") == 0);
  CHECK(env.count("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") == 0);
}

TEST_CASE("without inherit_env only airhost's own variables are set") {
  LaunchSpec spec;
  spec.inherit_env = false;
  RunContext ctx{"r", "/d", 1, 1, 3};
  auto env = as_map(build_rank_env(spec, 0, ctx, {"SECRET=x"}));
  CHECK(env.count("SECRET") == 0);
  CHECK(env.count("RANK") == 1);
}

TEST_CASE("ranks get the caller's terminal size, less the widest rank prefix, when it is known") {
  RunContext ctx{"r", "/d", 1, 1, 3};
  LaunchSpec spec;
  spec.nprocs = 12;  // "[rank 11] " is 10 columns
  SUBCASE("unknown: the caller's variables pass unchanged, none is made up") {
    auto env = as_map(build_rank_env(spec, 0, ctx, {"COLUMNS=100"}));
    CHECK(env["COLUMNS"] == "100");
    CHECK(env.count("LINES") == 0);
    CHECK(env.count("TQDM_NCOLS") == 0);
  }
  SUBCASE("known, with prefixes") {
    spec.output.terminal_columns = 120;
    spec.output.terminal_lines = 40;
    auto env = as_map(build_rank_env(spec, 3, ctx, {"COLUMNS=120"}));
    CHECK(env["COLUMNS"] == "110");
    CHECK(env["LINES"] == "40");
    CHECK(env["TQDM_NCOLS"] == "109");
  }
  SUBCASE("known, without prefixes; the user's own TQDM_NCOLS and explicit COLUMNS win") {
    spec.output.terminal_columns = 120;
    spec.output.prefix = false;
    spec.env["COLUMNS"] = "60";
    auto env = as_map(build_rank_env(spec, 0, ctx, {"TQDM_NCOLS=50"}));
    CHECK(env["COLUMNS"] == "60");
    CHECK(env["TQDM_NCOLS"] == "50");
    CHECK(env.count("LINES") == 0);
  }
  SUBCASE("too narrow to be worth it") {
    spec.output.terminal_columns = 25;
    auto env = as_map(build_rank_env(spec, 0, ctx, {}));
    CHECK(env.count("COLUMNS") == 0);
  }
}

TEST_CASE("the prefix names the rank") { CHECK(rank_prefix(3) == "[rank 3] "); }
