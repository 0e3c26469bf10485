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
  std::string hang;                     // timed_out by --on-hang stop: the hang report's first line
  std::string host_error;               // failed: what failed in the host itself (an exception in
                                        // a loop callback, an embedding program's callback)
};

// Fills report.outcome, exit_code, root_cause and message from its ranks and `cause`.
// The root cause is the earliest failure, with one exception: a rank that lost a peer
// (is_lost_peer_error) is the root cause only when nothing else failed. `signalled[i]`: the
// supervisor sent local rank i a teardown signal.
// A run stopped after the scheduler's warning (report.warning_signal) says so first.
void conclude_run(RunReport& report, const TeardownCause& cause, const std::vector<bool>& signalled);

// A rank as run.json shows it while the run lives: its state and times, whether it has a
// result, not the result's bytes.
RankReport live_record(const RankReport& rank);

// run.json, the one record of a run whoever started it (the CLI, the Python API, a submit):
// written when the run starts, with state "running" and the host's pid, and replaced
// (write_file_atomic) by run_json() as the run ends. `started_at`: when the launch began
// (seconds since the epoch). The readers (`airhost runs`, cli/run_records.hpp) tell a run
// whose host died without replacing it by that pid and its start time.
// run.json while the run is on: "running", with the ranks as they are (`ranks`: each one's pid,
// state and times; empty before any started: each "pending", with its log paths), the restarts
// so far and what failed the attempts before.
std::string run_json_started(const LaunchSpec& spec, double started_at, const std::vector<RankReport>& ranks = {},
                             int restarts = -1, const std::vector<std::string>& failed_attempts = {});
std::string run_json(const RunReport& report, const LaunchSpec& spec, double started_at);

// The file `airhost cancel` leaves in a run directory before it sends the host SIGTERM, so
// that the run, interrupted by it, ends "cancelled" rather than "interrupted".
inline constexpr const char* kCancelRequestFile = "cancel.request";

// The state run.json gives an ended run: succeeded, failed, timed_out, node_lost,
// not_started, interrupted (a signal, Ctrl-C, cancel() of the API), or cancelled (ended
// without succeeding after `airhost cancel` asked for it).
// preempted (ended without succeeding after the scheduler's warning, SIGUSR1/SIGUSR2), or
// requeued instead when the caller will requeue such a run (LaunchSpec::requeue_when_preempted).
std::string final_state(Outcome outcome, bool cancel_requested, bool warned = false, bool requeue = false);

// A run that failed on CUDA or NCCL (its root cause's exception names them: torch without
// CUDA, a CUDA call, the nccl backend) on CPU ranks (`spec.devices` empty: airhost found no
// GPU here): what happened and what to do, in one clause; "" otherwise.
std::string no_gpu_hint(const RunReport& report, const LaunchSpec& spec);

// One line per failed rank (rank, pid, exit code or signal, first line of its exception,
// log path), then the root cause's full traceback. Empty for a successful run.
std::string failure_summary(const RunReport& report);

// "exit 3", "SIGSEGV (signal 11)", "running".
std::string describe_exit(const RankReport& r);

}  // namespace airhost::detail
