// rank_usage.hpp — what each rank uses, seen from the host: the CPU and resident memory of its
// process group (the rank and what it started: DataLoader workers, a compiler), every few
// seconds, from /proc; on a GPU run also its GPU's utilisation and the GPU memory its
// processes hold, from NVML (airhost/gpu_usage.hpp, read off the loop). No thread in the ranks: the supervisor samples on its loop. Kept in
// <run_dir>/metrics/ranks.jsonl (one JSON object per rank per sample), logged into the launch's
// MLflow run as system metrics per rank when it ends (cli/tracking.cpp), and said in the hang
// and timeout reports, where a rank idle while the others are busy is named.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "airhost/gpu_usage.hpp"
#include "launch/procs/proc_tree.hpp"

namespace airhost::detail {

struct RankUsage {
  int rank = 0;
  int node = 0;
  double t = 0;              // seconds since the epoch
  double cpu_percent = -1;   // of one core since the rank's previous sample; -1 on its first
  std::uint64_t rss = 0;     // bytes resident, the group's sum
  int gpu = -1;              // its GPU (NVML index); -1: none known
  int gpu_util_percent = -1; // that GPU's utilisation
  std::uint64_t gpu_memory = 0;  // bytes on it: its processes' (or the whole GPU's, see below)
};

// Which GPU is a rank's, and how much of it it holds. The driver lists the processes on each
// GPU: a rank whose process group is among them has that GPU (the one it holds most memory
// on) and the memory its processes hold. A rank not listed (its PIDs are another namespace's
// than the driver's, in some containers, or it has not touched the GPU yet) falls back to
// `device`, the GPU its LOCAL_RANK selects (-1: none), with that GPU's whole memory in use.
void add_gpu_usage(RankUsage& u, const std::vector<int>& group_pids, int device, const GpuUsage& gpus);

class UsageMeter {
 public:
  explicit UsageMeter(long ticks_per_second = 100) : hz_(ticks_per_second > 0 ? ticks_per_second : 100) {}
  // One sample at `now` of each (rank, pid) given: the sums over the processes of `procs` in the
  // rank's process group (each rank leads its own).
  std::vector<RankUsage> sample(double now, const std::vector<std::pair<int, int>>& rank_pids,
                                const std::vector<ProcStat>& procs, int node);

 private:
  long hz_;
  std::map<int, std::pair<double, std::uint64_t>> last_;  // rank → (time, CPU ticks)
};

// {"t": ..., "rank": 0, "node": 0, "cpu_percent": 98.5, "rss_bytes": 123} and a newline;
// cpu_percent null on a rank's first sample; with a GPU, also "gpu", "gpu_util_percent" (null
// when not known) and "gpu_memory_bytes".
std::string usage_json_line(const RankUsage& u);

// One line for a report: each rank's CPU and memory ("rank 0 99% 1.1 GiB, GPU 3 97% 70.2 GiB;
// ..."), and, when some ranks are idle (under 5% of a core, and of their GPU) while others are
// busy (over 50% of either), which. Empty when there is no sample with a CPU figure.
std::string usage_text(const std::vector<RankUsage>& usage);

}  // namespace airhost::detail
