// airhost/report.hpp — what a finished run hands back.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace airhost {

// An exception captured inside a rank's interpreter and sent over the control channel.
struct ErrorRecord {
  std::string type;        // qualified name, e.g. "ValueError" or "torch.distributed.DistBackendError"
  std::string message;     // str(exception)
  std::string traceback;   // the full formatted Python traceback
  std::string pickled;     // the pickled exception when it could be pickled, else empty
  double time = 0;         // seconds since the epoch when the rank caught it
};

// How a rank's process ended. The state machine of one rank:
//   pending → running → {succeeded | failed | stopped}; `stopped` means airhost ended it
//   during a teardown that another rank, the timeout or a signal to the host started.
enum class RankState { pending, running, succeeded, failed, stopped };

const char* to_string(RankState s) noexcept;

struct RankReport {
  int rank = 0;                        // global rank
  int local_rank = 0;
  int pid = 0;
  RankState state = RankState::pending;
  int exit_code = -1;                  // process exit status, or -1 if it died of a signal
  int term_signal = 0;                 // signal that killed it, 0 if none
  std::optional<std::string> result;   // Kind::function / pickled: the pickled return value
  std::optional<ErrorRecord> error;    // the exception it raised, if it sent one
  std::string stdout_log;              // path of the full stdout log
  std::string stderr_log;              // path of the full stderr log
  double started_at = 0;               // seconds since the epoch
  double ended_at = 0;
};

enum class Outcome {
  succeeded,    // every rank exited 0
  failed,       // a rank failed; the others were stopped
  timed_out,    // the timeout stopped the run
  interrupted,  // a signal to the host or cancel() stopped the run
  not_started,  // the launch failed before any rank ran (see RunReport::message)
  node_lost,    // several nodes: another node failed, was stopped or lost, or never joined;
                // this node's ranks were stopped (or had succeeded: the job did not)
};

const char* to_string(Outcome o) noexcept;

struct RunReport {
  Outcome outcome = Outcome::not_started;
  int exit_code = 0;                 // airhost's exit code by the contract in exit_code.hpp
  int root_cause = -1;               // rank of the earliest failure, -1 if none
  int interrupt_signal = 0;          // the signal that interrupted the run, if any
  std::string run_id;
  std::string run_dir;
  std::string message;               // one-sentence summary of what happened
  std::vector<RankReport> ranks;     // indexed by local rank; the last attempt's
  double wall_seconds = 0;           // the whole run, restarts included
  int restarts = 0;                  // how many times the group was restarted (LaunchSpec::max_restarts)
  std::vector<std::string> failed_attempts;  // the message of each attempt that was restarted
  bool warm = false;                 // the ranks were forked by a warm server
  std::string start_mode;            // one line: "warm start (...)" or "cold start (why not warm)"

  bool ok() const noexcept { return outcome == Outcome::succeeded; }
};

}  // namespace airhost
