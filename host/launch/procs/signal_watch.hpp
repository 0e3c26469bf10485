// signal_watch.hpp — the host's signals, watched on its loop for one run, and the program's
// own dispositions put back after it.
//
// libuv leaves a signal it stops watching at SIG_DFL; what the program had before the run is
// restored instead (the CLI's handler: as PID 1 a signal at SIG_DFL would be lost), with the
// signals blocked meanwhile so that none arrives in between.
#pragma once

#include <signal.h>
#include <uv.h>

#include <functional>

namespace airhost::detail {

// SIGINT, SIGTERM and SIGHUP end the run; SIGUSR1 and SIGUSR2 end nothing (a scheduler's
// warning that the job's time is nearly up, passed to the ranks); nor does SIGQUIT (Ctrl-\:
// the ranks' stacks). What each does is the supervisor's.
inline constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};

class SignalWatch {
 public:
  // Watches every kHandledSignals on `loop`; `on_signal` runs on the loop's thread.
  void start(uv_loop_t* loop, std::function<void(int sig)> on_signal);
  // Stops watching and puts back what the signals did before start(). Idempotent.
  void close();

 private:
  static constexpr int kCount = sizeof kHandledSignals / sizeof kHandledSignals[0];
  uv_signal_t handles_[kCount]{};
  struct sigaction saved_[kCount]{};
  int count_ = 0;
  std::function<void(int)> on_signal_;
};

}  // namespace airhost::detail
