// rank_usage.hpp — what each rank uses, seen from the host: the CPU and resident memory of its
// process group (the rank and what it started: DataLoader workers, a compiler), every few
// seconds, from /proc. No thread in the ranks: the supervisor samples on its loop. Kept in
// <run_dir>/metrics/ranks.jsonl (one JSON object per rank per sample), logged into the launch's
// MLflow run as system metrics per rank when it ends (cli/tracking.cpp), and said in the hang
// and timeout reports, where a rank idle while the others are busy is named.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launch/proc_tree.hpp"

namespace airhost::detail {

struct RankUsage {
  int rank = 0;
  int node = 0;
  double t = 0;              // seconds since the epoch
  double cpu_percent = -1;   // of one core since the rank's previous sample; -1 on its first
  std::uint64_t rss = 0;     // bytes resident, the group's sum
};

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
// cpu_percent null on a rank's first sample.
std::string usage_json_line(const RankUsage& u);

// One line for a report: each rank's CPU and memory ("rank 0 99% CPU 1.1 GiB; ..."), and, when
// some ranks are idle (under 5% of a core) while others are busy (over 50%), which. Empty
// when there is no sample with a CPU figure.
std::string usage_text(const std::vector<RankUsage>& usage);

}  // namespace airhost::detail
