// supervisor.hpp — the libuv loop that watches one run's ranks.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "airhost/callbacks.hpp"
#include "airhost/report.hpp"
#include "launch/output/host_output.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/rank/rank_starter.hpp"
#include "launch/watch/stacks.hpp"

namespace airhost::detail {

// The life of a run, in the style of tini: spawn every rank, watch, tear down, report.
//
//   running ──(a rank fails | timeout | signal/cancel)──▶ tearing down ──▶ done
//      │                                                   SIGTERM (or the host's signal),
//      └──(every rank exits 0)──────────────────────────▶ done   SIGKILL after the grace
//
// "done" means every rank is reaped and every pipe has reached EOF, so no output is lost.
class Supervisor {
 public:
  struct Plan {
    const LaunchSpec* spec;
    const Callbacks* callbacks;
    RunContext context;
    std::vector<std::string> rank_argv;  // the command every rank runs
    std::vector<std::string> base_env;   // the caller's environment
    // What is left of spec.timeout for this attempt (earlier attempts of a restarted run used
    // the rest); 0 = no limit.
    std::chrono::milliseconds time_limit{0};
    // Called once, on the loop's thread, when the teardown begins: `why` is a predicate for
    // "node N (host) ...", e.g. "failed: rank 3 exited with code 1 (ValueError: boom)";
    // `cascade` when this node only follows another one's failure (abort(), or a rank that
    // failed because it lost a peer). The node link tells the other nodes with it. `hung`: a
    // hang ended the run (--on-hang stop; Outcome::timed_out, `why` "hung: ...").
    std::function<void(Outcome reason, const std::string& why, bool cascade, bool hung)> on_teardown;
    // Where the host's own output goes (the caller's terminal, the host log); not null.
    HostOutput* out = nullptr;
    // Called on the loop's thread every `alive_every` while the loop turns: the node link stops
    // heartbeating for a node whose loop is stuck (node_link.hpp).
    std::function<void()> on_alive;
    std::chrono::milliseconds alive_every{1000};
    // Several nodes (the node link): node 0 asks the other nodes for their ranks' stacks
    // (`only`: the ranks asked, null for all), so that `airhost stacks` and the hang watch
    // there see the whole job; another node sends its answer to node 0. Any thread.
    std::function<void(unsigned seq, const std::vector<int>* only)> ask_stacks;
    // (the launcher encodes the answer to the node link's cap).
    std::function<void(unsigned seq, const std::vector<RankStacks>& ranks)> answer_stacks;
    // The ranks as they are now (pid, state, times, exit; no results), on the loop's thread,
    // at most every kRecordEveryMs while ranks start and exit: the launcher rewrites run.json
    // with them, so that a live run's record shows each rank as it is.
    std::function<void(const std::vector<RankReport>&)> on_ranks_changed;
  };

  Supervisor(Plan plan, std::unique_ptr<RankStarter> starter);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs the loop to completion. Call once.
  RunReport run();

  // Any thread: tear the run down as if the host got `sig`.
  void cancel(int sig) noexcept;

  // Any thread: another node of the run failed or was lost (`why` says which); tear down with
  // Outcome::node_lost (Outcome::timed_out when that node timed out or hung, `timed_out`),
  // unless a teardown is already under way.
  // `hung`: that node's hang watch ended it; this node's run ends as hung too.
  void abort(const std::string& why, bool timed_out = false, bool hung = false);

  // Any thread, another node than 0: node 0 asks for this node's ranks' stacks (request `seq`;
  // `only`: ranks, comma-separated, "" for all); the answer goes to plan.answer_stacks.
  void stacks_asked(unsigned seq, const std::string& only);
  // Any thread, node 0: node `node`'s answer to request `seq` (encode_rank_stacks).
  void stacks_answered(int node, unsigned seq, const std::string& ranks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost::detail
