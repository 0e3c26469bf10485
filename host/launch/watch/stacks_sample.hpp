// stacks_sample.hpp — `airhost stacks --sample 10s`: where each rank spends its time, from
// many snapshots of its stacks (stacks_service.hpp takes them, one every interval), as a
// sampling profiler tells it. Pure: no loop, no processes.
//
// Per rank, each function (file and name) met in its main thread's stack counts:
//   own    the samples it was the innermost Python frame in (where the rank *is*: a busy
//          loop, a C call made from it, a wait);
//   total  the samples it was anywhere in the stack (what the rank is *inside*).
// Ranks are grouped by the function they spend most of their samples in (own), the odd ones
// out first, as the stacks are (stacks.hpp): "rank 1 spends 62% in load_batch while ranks 0,
// 2-3 wait in all_reduce" is the first line.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "launch/watch/stacks.hpp"

namespace airhost::detail {

struct SampledFunction {
  std::string file;
  std::string function;
  int line = -1;        // its most frequent line as the innermost frame (or anywhere, if never)
  std::size_t own = 0;
  std::size_t total = 0;
  std::string caller;   // "file:line in function" of its most frequent caller, when innermost
};

struct RankProfile {
  int rank = 0;
  int local_rank = 0;
  int node = 0;
  int pid = 0;
  std::size_t asked = 0;     // rounds in which the rank was alive and asked
  std::size_t answered = 0;  // ... and answered: the samples the shares are of
  std::string status;        // when it never answered: why (the last round's word)
  double cpu_percent = -1;   // of one core, over the sampling; -1 when /proc could not tell
  std::vector<SampledFunction> functions;  // by own, then total, most first
};

struct StacksSample {
  std::string run_id;
  double started_at = 0;
  double seconds = 0;      // how long it sampled
  long interval_ms = 0;    // asked for: one round every interval
  std::size_t rounds = 0;
  std::string file;        // the sample in the run directory; empty when not written
  std::vector<RankProfile> ranks;  // by rank
};

// Adds snapshots one by one, then makes the profile.
class StacksSampler {
 public:
  void add(const StacksSnapshot& snap);
  // Every rank seen, by rank; `cpu_percent` left at -1 (the service measures it).
  StacksSample result() const;

 private:
  struct Counts {
    std::size_t own = 0, total = 0;
    std::map<int, std::size_t> own_lines, lines;
    std::map<std::string, std::size_t> callers;
  };
  struct PerRank {
    RankProfile head;
    std::map<std::pair<std::string, std::string>, Counts> functions;  // (file, function)
  };
  std::map<int, PerRank> ranks_;
  std::size_t rounds_ = 0;
};

// Ranks grouped by the function they spend most samples in (own); ranks that never answered
// by their status. Smallest groups first, those in torch.distributed last among equals.
std::vector<std::vector<std::size_t>> group_profiles(const std::vector<RankProfile>& ranks);

// The share of `part` in `whole` as "62%" ("<1%" for a sliver, "0%" for none).
std::string percent_text(std::size_t part, std::size_t whole);

std::string render_sample_text(const StacksSample& s);
std::string render_sample_json(const StacksSample& s);

}  // namespace airhost::detail
