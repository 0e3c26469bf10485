#include "launch/rank/rank_env.hpp"

#include <map>

namespace airhost::detail {

std::vector<std::string> build_rank_env(const LaunchSpec& spec, int local_rank, const RunContext& ctx,
                                        const std::vector<std::string>& base) {
  // An ordered map keeps the output deterministic, which the tests and `env | sort` like.
  std::map<std::string, std::string> env;
  if (spec.inherit_env) {
    for (const auto& kv : base) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }

  // The nodes' join secret is the hosts' alone: user code (and what it logs of its
  // environment, an MLflow run's parameters say) never sees it.
  env.erase("AIRHOST_JOIN_TOKEN");

  env.try_emplace("OMP_NUM_THREADS", "1");
  env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");

  const int rank = spec.node_rank * spec.nprocs + local_rank;
  const int world = spec.nnodes * spec.nprocs;
  env["PYTHONUNBUFFERED"] = "1";
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_WORLD_SIZE"] = std::to_string(spec.nprocs);
  env["GROUP_RANK"] = std::to_string(spec.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(spec.nnodes);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(world);
  env["ROLE_NAME"] = "default";
  env["MASTER_ADDR"] = spec.master_addr;
  env["MASTER_PORT"] = std::to_string(ctx.master_port);
  env["TORCHELASTIC_RUN_ID"] = ctx.run_id;
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(ctx.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.max_restarts);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  env["AIRHOST_RUN_ID"] = ctx.run_id;
  env["AIRHOST_RUN_DIR"] = ctx.run_dir;
  env["AIRHOST_HOST_PID"] = std::to_string(ctx.host_pid);
  env["AIRHOST_CONTROL_FD"] = std::to_string(ctx.control_fd);
  // A rank's stdout and stderr are pipes, so nothing in it can ask the terminal its width:
  // tell it the caller's, less the prefix its lines get there, so that a bar drawn to the
  // width (tqdm, Lightning's, the HF Trainer's) fits one line of it. shutil.get_terminal_size
  // reads COLUMNS and LINES; tqdm asks only the descriptor, then its TQDM_NCOLS default, one
  // less than the width as it does on a terminal (so the cursor never wraps).
  if (spec.output.terminal_columns > 0) {
    const int prefix = spec.output.prefix ? static_cast<int>(rank_prefix(world - 1).size()) : 0;
    const int columns = spec.output.terminal_columns - prefix;
    if (columns >= 20) {
      env["COLUMNS"] = std::to_string(columns);
      if (spec.output.terminal_lines > 0) env["LINES"] = std::to_string(spec.output.terminal_lines);
      env.try_emplace("TQDM_NCOLS", std::to_string(columns - 1));
    }
  }
  if (!spec.devices.empty()) {
    std::string list;
    for (int d : spec.devices) list += (list.empty() ? "" : ",") + std::to_string(d);
    env["CUDA_VISIBLE_DEVICES"] = list;
    // NVML numbers GPUs in PCI bus order, CUDA by speed unless told otherwise: on a node of
    // mixed GPUs the indices above would name other devices.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID";
    // NCCL's flight recorder, on unless the user chose: a bounded ring of each rank's last
    // collectives, dumped into the run directory when a collective times out, so a hang
    // says which collective and which ranks never arrived (torch's fr_trace reads the dumps).
    if (!env.count("TORCH_FR_BUFFER_SIZE")) env.try_emplace("TORCH_NCCL_TRACE_BUFFER_SIZE", kFlightRecorderEntries);
    env.try_emplace("TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
    if (!env.count("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") && !ctx.run_dir.empty())
      env.try_emplace("TORCH_FR_DUMP_TEMP_FILE", ctx.run_dir + "/stacks/" + kFlightRecorderPrefix);
    // ... and on demand: NCCL's monitor thread makes <prefix>N.pipe and dumps when it reads a
    // byte there, which the host writes when its hang watch or the timeout finds the ranks
    // stuck (flight_recorder.hpp).
    if (!ctx.run_dir.empty())
      env.try_emplace("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", ctx.run_dir + "/stacks/" + kFlightRecorderPrefix);
  }

  for (const auto& [k, v] : spec.env) env[k] = v;

  std::vector<std::string> out;
  out.reserve(env.size());
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::string rank_prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

}  // namespace airhost::detail
