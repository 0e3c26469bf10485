// hang_watch.hpp — when a run has stopped making progress, and what to say about it.
//
// The supervisor samples every rank of this node every few seconds (hang_sample_every): the
// stack of its main thread (stacks_service.hpp, a signal-safe dump from inside the
// interpreter) and the CPU time of its process group (/proc: the rank and what it started,
// DataLoader workers included). A rank made progress between two samples when its main-thread
// stack moved, or when it was busy (kBusyShare of a core) while not waiting in
// torch.distributed (a collective, a barrier, the store: a rank that spins there waits all the
// same). The run is hung when no
// rank made progress for hang_timeout; a healthy loop moves its stack or burns CPU between
// samples, however quiet its output, so a long silent epoch is never taken for a hang.
//
// Pure: no clock, no I/O; the supervisor feeds it samples and prints what it says.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launch/watch/stacks.hpp"

namespace airhost::detail {

// One rank at one sample.
struct HangSample {
  int rank = 0;
  bool alive = true;        // an exited rank neither progresses nor holds the run
  std::string where;        // its main-thread stack, whole (empty: no answer)
  bool in_collective = false;
  std::uint64_t cpu = 0;    // CPU time of its process group so far, clock ticks
};

// How often to sample for a given hang_timeout: a sixth of it, between 1 and 60 seconds.
std::chrono::milliseconds hang_sample_every(std::chrono::milliseconds timeout);

// A rank's process group burned CPU "outside torch.distributed" between two samples when it
// used at least this share of one core over the interval (and at least kBusyMinTicks): less is
// what a stuck rank's library threads spend on their own (gloo's transport polls every 10 ms,
// NCCL's watchdog and monitor threads wake every second), which must not hide a hang.
inline constexpr double kBusyShare = 0.05;
inline constexpr std::uint64_t kBusyMinTicks = 2;

class HangWatch {
 public:
  // `ticks_per_second`: the unit of HangSample::cpu (sysconf(_SC_CLK_TCK)).
  explicit HangWatch(std::chrono::milliseconds timeout, long ticks_per_second = 100)
      : timeout_(timeout), hz_(ticks_per_second > 0 ? ticks_per_second : 100) {}
  // The samples of every rank taken at `now` (seconds, any steady origin). True the first time
  // no rank has made progress for the timeout; again only after progress and a new stall.
  bool feed(double now, const std::vector<HangSample>& ranks);
  // Whether a rank whose process group has used `cpu` ticks so far must be asked for its stack:
  // one that burned CPU outside torch.distributed since the last sample made progress without
  // being asked (a busy rank is never interrupted), one that stood still or waits in a
  // collective must show whether its stack moved.
  bool wants_stack(int rank, std::uint64_t cpu, double now) const;
  // The sample of a rank that was not asked: as last seen, with its CPU time now.
  HangSample carried(int rank, std::uint64_t cpu) const;
  // Seconds since the last progress of any rank (0 before two samples).
  double still_for(double now) const { return started_ ? now - last_progress_ : 0; }

 private:
  // Whether going from `before` to `after` ticks over `seconds` is busy (kBusyShare).
  bool busy(std::uint64_t before, std::uint64_t after, double seconds) const;

  std::chrono::milliseconds timeout_;
  long hz_;
  bool started_ = false, reported_ = false;
  double last_progress_ = 0;
  double last_sample_ = 0;
  std::map<int, HangSample> last_;
};

// The hang report's first line, after "run ID: ": how long, which rank is elsewhere and where,
// what the others wait in. E.g. "no rank has made progress for 15 s (hang_timeout 15 s): rank 1
// is elsewhere, at train.py:41 in load_batch, while ranks 0,2-7 wait in all_reduce".
std::string hang_headline(const StacksSnapshot& snap, double still_seconds, std::chrono::milliseconds timeout);

// The sample of one rank's stacks, as HangWatch takes it (cpu filled in by the caller).
HangSample hang_sample(const RankStacks& r);

}  // namespace airhost::detail
