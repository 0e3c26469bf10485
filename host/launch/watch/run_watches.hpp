// run_watches.hpp — everything that watches one attempt's ranks without changing what they
// do, on the supervisor's loop:
//
//   the stacks      Ctrl-\, `airhost stacks` (the run's socket), node 0 asking the other
//                   nodes, and the last look before a timeout or a failure stops the ranks
//                   (stacks_service.hpp);
//   the hang watch  every rank sampled every hang_sample_every(); one report when no rank
//                   has made progress for hang_timeout (hang_watch.hpp), and with --on-hang
//                   stop, the end of the run;
//   the usage       each rank's CPU, memory (and GPU) every kUsageEveryMs into
//                   <run_dir>/metrics/ranks.jsonl (rank_usage.hpp);
//   the flight recorder  torch's NCCL ring asked for a dump when GPU ranks are stuck
//                   (flight_recorder.hpp).
//
// The supervisor owns one per attempt, tells it of the ranks through Host::ranks, and hears
// back through the other Host callbacks; it never reaches into the watches' timers.
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "airhost/gpu_usage.hpp"
#include "airhost/launch.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/watch/hang_watch.hpp"
#include "launch/watch/rank_usage.hpp"
#include "launch/watch/stacks_service.hpp"

namespace airhost::detail {

class RunWatches {
 public:
  struct Host {
    // This node's ranks as they are now.
    std::function<std::vector<StacksService::Rank>()> ranks;
    // Whether the run is still in its running phase (no teardown begun).
    std::function<bool()> running;
    // Runs a callback's body so that an exception ends the run instead of unwinding uv_run.
    std::function<void(const char* where, const std::function<void()>& body)> guarded;
    // Ends a line a rank left open on the console, and flushes: the host speaks next.
    std::function<void()> end_open_lines;
    // The hang report's first line, when the hang watch reported; `stops`: --on-hang stop,
    // and stop_timed_out() follows once the flight recorders dumped.
    std::function<void(const std::string& headline, bool stops)> hang_seen;
    // Ends the run as timed out (the timeout, or --on-hang stop).
    std::function<void()> stop_timed_out;
  };
  struct Options {
    uv_loop_t* loop = nullptr;
    const LaunchSpec* spec = nullptr;
    RunContext context;
    // The host's own lines: on its terminal and in the host log (say), or in the log only.
    std::function<void(std::string_view line)> say, log;
    // Node 0 of several: asks the other nodes for their ranks' stacks (`only`: null for all).
    std::function<void(unsigned seq, const std::vector<int>* only)> ask_nodes;
    // Another node: sends its ranks' stacks to node 0.
    std::function<void(unsigned seq, const std::vector<RankStacks>& ranks)> answer_stacks;
  };

  RunWatches(Options options, Host host);
  ~RunWatches();
  RunWatches(const RunWatches&) = delete;
  RunWatches& operator=(const RunWatches&) = delete;

  // Once the ranks exist: the stacks socket (whatever the ranks' state), then once they are
  // started, start_timers(): the hang watch and the usage sampling.
  void start_stacks();
  void start_timers();
  // Closes the timers and the socket; the handles are freed as the loop ends.
  void close();

  bool has_stacks() const { return stacks_ != nullptr && !closed_; }
  // Every rank's stacks, grouped, on the terminal (and in the host log), after `why` if given,
  // the full stacks in <run_dir>/stacks/<time>.txt; `then` runs once they are shown (at once
  // when there are no stacks to take).
  void show_stacks(const std::string& why, std::function<void()> then = {});
  // The timeout passed: where each rank is, what they use, torch's flight recorder; then `stop`.
  void at_timeout(std::function<void()> stop);
  // Another node: node 0 asked for this node's ranks' stacks (`only`: "1,3", "" for all).
  void answer_stacks_ask(unsigned seq, const std::string& only);
  // Node 0: another node's answer (encode_rank_stacks' bytes).
  void take_answer(int node, unsigned seq, const std::string& ranks);

 private:
  void say_stacks(const StacksSnapshot& snap, const std::string& headline = {});
  void sample_usage();
  void say_usage();
  void sample_for_hangs();
  void report_hang(double still);
  void ask_flight_recorder(std::function<void()> then, bool wait);
  std::map<int, std::uint64_t> group_cpu() const;
  const LaunchSpec& spec() const { return *o_.spec; }

  Options o_;
  Host host_;
  bool closed_ = false;
  std::unique_ptr<StacksService> stacks_;
  std::unique_ptr<HangWatch> hang_watch_;
  uv_timer_t hang_timer_{};
  struct FlightRecorderWait {
    std::vector<int> asked;
    double since = 0;
    std::uint64_t deadline = 0;
    std::function<void()> then;
  } fr_wait_;
  uv_timer_t fr_timer_{};
  UsageMeter usage_meter_;
  std::vector<RankUsage> last_usage_;
  std::unique_ptr<GpuUsageReader> gpu_reader_;  // a GPU run's: NVML, read off the loop
  uv_timer_t usage_timer_{};
};

}  // namespace airhost::detail
