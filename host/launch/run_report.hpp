// run_report.hpp — a run's verdict (outcome, root cause, exit code, message), run.json and the
// human failure summary, from one RunReport.
#pragma once

#include <string>
#include <vector>

#include "airhost/launch.hpp"
#include "airhost/report.hpp"

namespace airhost::detail {

// An error a rank raises because another rank went away (gloo's and NCCL's words for a peer
// that closed its connection or aborted the communicator): a cascade, not a root cause.
bool is_lost_peer_error(const ErrorRecord& e);

// Why a run's teardown began, as the supervisor saw it; none = it was not torn down.
struct TeardownCause {
  bool torn_down = false;
  Outcome reason = Outcome::succeeded;  // failed, timed_out, interrupted or node_lost
  int interrupt_signal = 0;             // interrupted: the host's signal
  std::string node_lost_why;            // node_lost: which node, and what happened to it
  long timeout_seconds = 0;             // timed_out: the limit
  std::string host_error;               // failed: what failed in the host itself (an exception in
                                        // a loop callback, an embedding program's callback)
};

// Fills report.outcome, exit_code, root_cause and message from its ranks and `cause`.
// The root cause is the earliest failure, with one exception: a rank that lost a peer
// (is_lost_peer_error) is the root cause only when nothing else failed. `signalled[i]`: the
// supervisor sent local rank i a teardown signal.
void conclude_run(RunReport& report, const TeardownCause& cause, const std::vector<bool>& signalled);

std::string run_json(const RunReport& report, const LaunchSpec& spec);

// One line per failed rank (rank, pid, exit code or signal, first line of its exception,
// log path), then the root cause's full traceback. Empty for a successful run.
std::string failure_summary(const RunReport& report);

// "exit 3", "SIGSEGV (signal 11)", "running".
std::string describe_exit(const RankReport& r);

}  // namespace airhost::detail
