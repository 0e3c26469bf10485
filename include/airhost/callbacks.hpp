// airhost/callbacks.hpp — what a launch tells its caller while it runs.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "airhost/report.hpp"

namespace airhost {

enum class Stream { out = 1, err = 2 };

struct RankEvent {
  enum class Kind { started, exited };
  Kind kind;
  int rank;          // global rank
  int pid;
  int exit_code;     // exited: the status, or -1 for a signal death
  int term_signal;   // exited: the signal, or 0
};

// A failed attempt that the launcher is about to restart (LaunchSpec::max_restarts).
struct RestartEvent {
  int restart;              // 1 for the first restart
  int max_restarts;
  std::string reason;       // the failed attempt's one-sentence message
};

struct Callbacks {
  // One complete line of a rank's output, without its newline (a final line without one
  // is delivered at EOF). Called on the supervising thread; keep it quick.
  std::function<void(int rank, Stream, std::string_view line)> on_output;
  // What the console shows, as it comes: the shown ranks' output (OutputOptions: prefix,
  // ranks) with `\r` redraws and partial lines as soon as they are worth showing, cut so that
  // no line holds two ranks' text; bytes to write to the caller's stdout or stderr in the
  // order given. Called whether or not output is forwarded (the Python API writes these to
  // sys.stdout and sys.stderr). Called on the supervising thread; keep it quick.
  std::function<void(Stream, std::string_view bytes)> on_console;
  std::function<void(const RankEvent&)> on_rank_event;
  // Before a restart. Without it, the launcher says so on stderr when output is forwarded.
  std::function<void(const RestartEvent&)> on_restart;
  // Once, before the first rank starts, when LaunchSpec::warm_socket is set: whether the ranks
  // are forked warm or started cold, as one line (RunReport::start_mode).
  std::function<void(bool warm, const std::string& line)> on_start_mode;
  // Once, when the run is over, right before its final run.json replaces the one that says it
  // runs: what must be in the run directory before anyone reading run.json can take the run
  // for ended (the CLI saves the results there, so that a reader never finds an ended run
  // without them). Called on the launching thread; an exception it throws is said and ignored.
  std::function<void(const RunReport&)> before_final_record;
  // Each line airhost says about the run, as the CLI prints it on stderr after "airhost: "
  // (no newline): a hang report and where each rank is, where the other ranks were when one
  // failed, a node joining or lost, a rank's note. Every one is also in logs/host.log. For a
  // caller that shows the console itself (on_console, output not forwarded), so that its user
  // hears what a CLI user hears. Any thread; keep it quick.
  std::function<void(const std::string& line)> on_host_line;
};

}  // namespace airhost
