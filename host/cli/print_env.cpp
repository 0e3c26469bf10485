// print_env.cpp — `airhost --print-env`.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "base/util.hpp"
#include "cli/commands.hpp"
#include "launch/rank/rank_env.hpp"

namespace airhost::detail {

// --print-env: where this node's place in the job came from, then what each local rank's
// environment would add to or change in this one (built by build_rank_env, as a launch does).
int print_env(const LaunchSpec& spec, const ClusterResolution& cluster) {
  if (spec.node_rank >= spec.nnodes)
    return usage_error("node_rank must be in [0, nnodes); got node_rank " + std::to_string(spec.node_rank) + " of " +
                       std::to_string(spec.nnodes) + " nodes");
  const ClusterTopology& t = cluster.topology;
  std::printf("cluster: %s\n", t.source.empty() ? "none detected (no Slurm job, no PET_NNODES, no Kubeflow PyTorchJob)"
                                                 : (t.source + " (" + t.evidence + ")").c_str());
  std::string gpus;
  for (int d : spec.devices) gpus += (gpus.empty() ? "" : ",") + std::to_string(d);
  const std::string accel = std::to_string(spec.nprocs) + (gpus.empty() ? " (CPU ranks)" : " (GPUs " + gpus + ")");
  const std::string port = spec.master_port ? std::to_string(spec.master_port) : "0 (a free port, chosen at launch)";
  const std::string default_accel = spec.devices.empty() ? "default: 1 rank, no GPU visible"
                                                         : "default: one rank per visible GPU";
  const std::vector<std::array<std::string, 3>> rows = {
      {"nnodes", std::to_string(spec.nnodes), cluster.origin.at("nnodes")},
      {"node_rank", std::to_string(spec.node_rank), cluster.origin.at("node_rank")},
      {"master_addr", spec.master_addr, cluster.origin.at("master_addr")},
      {"master_port", port, cluster.origin.at("master_port")},
      {"accelerators", accel, cluster.origin.at("accelerators") == "default" ? default_accel : cluster.origin.at("accelerators")},
  };
  std::size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row[1].size());
  for (const auto& [name, value, origin] : rows)
    std::printf("  %-13s %-*s  %s\n", name.c_str(), static_cast<int>(width), value.c_str(), origin.c_str());
  for (const auto& note : t.notes) std::printf("  note: %s\n", note.c_str());

  RunContext ctx;
  ctx.run_id = spec.run_id.empty() ? "<run id>" : spec.run_id;
  ctx.run_dir = spec.run_dir.empty() ? default_runs_root() + "/" + ctx.run_id : spec.run_dir;
  ctx.master_port = spec.master_port;
  ctx.host_pid = static_cast<int>(::getpid());
  const auto base = current_environment();
  const std::set<std::string> unchanged(base.begin(), base.end());
  for (int local = 0; local < spec.nprocs; ++local) {
    std::printf("local rank %d (global rank %d), besides this environment:\n", local,
                spec.node_rank * spec.nprocs + local);
    for (const auto& kv : build_rank_env(spec, local, ctx, base)) {
      if (unchanged.count(kv)) continue;
      std::string line = kv;
      if (kv.rfind("MASTER_PORT=", 0) == 0 && spec.master_port == 0) line = "MASTER_PORT=<a free port, chosen at launch>";
      if (kv.rfind("AIRHOST_HOST_PID=", 0) == 0) line = "AIRHOST_HOST_PID=<airhost's pid>";
      std::printf("  %s\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace airhost::detail
