// airhost/launcher.hpp — run a LaunchSpec and supervise its ranks until they are all gone.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "airhost/launch.hpp"
#include "airhost/report.hpp"

namespace airhost {

// A LaunchSpec that cannot run (bad values, missing script, missing rank binary...).
// what() is one sentence that says what was wrong and what to do.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  std::function<void(const RankEvent&)> on_rank_event;
  // Before a restart. Without it, the launcher says so on stderr when output is forwarded.
  std::function<void(const RestartEvent&)> on_restart;
  // Once, before the first rank starts, when LaunchSpec::warm_socket is set: whether the ranks
  // are forked warm or started cold, as one line (RunReport::start_mode).
  std::function<void(bool warm, const std::string& line)> on_start_mode;
};

// Runs one launch. Thread-safe only through cancel(); run() blocks until every rank is
// reaped, the logs are flushed and run.json is written. One Launcher runs once.
class Launcher {
 public:
  explicit Launcher(LaunchSpec spec, Callbacks callbacks = {});
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Throws LaunchError if run() would refuse the spec; starts nothing. For callers that
  // prepare more (an MLflow run, a GPU lease) only once the spec is known to be good.
  void check() const;

  // Validates the spec (throws LaunchError), starts every rank, supervises them.
  // Never calls exit(); returns the report whatever the ranks did.
  RunReport run();

  // Stops a running launch as if the host got `signal` (SIGINT by default): the ranks get
  // it, then SIGKILL after the grace period. Safe from any thread and from a signal-free
  // context; a no-op before run() starts or after it returns.
  void cancel(int signal = 2) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost
