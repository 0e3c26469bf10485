// sigpipe.hpp — writes of this thread that can never raise SIGPIPE, whatever the program's
// disposition of it.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace airhost::detail {

// While alive, a write of this thread to a socket or pipe whose reader is gone (a stacks
// client that left before its answer, a flight-recorder pipe closed under us, a node link
// peer) fails with EPIPE instead of killing the process: SIGPIPE is blocked in this thread,
// so the signal the kernel raises for the write stays pending on it. On destruction a
// SIGPIPE raised meanwhile is consumed and the thread's mask put back. The CLI ignores
// SIGPIPE; a program that embeds libairhost may not, and its run must not die of a client
// (libcurl's sigpipe_ignore does the same for the same reason). Threads started meanwhile
// inherit the block; uv_spawn's children start with an empty mask.
class SigpipeGuard {
 public:
  SigpipeGuard() noexcept {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, &old_);
    blocked_before_ = sigismember(&old_, SIGPIPE) == 1;
    sigset_t pending;
    pending_before_ = ::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    if (blocked_before_) return;  // an outer guard (or the program) owns the block
    sigset_t pending;
    if (!pending_before_ && ::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec none{0, 0};
      while (::sigtimedwait(&pipe, nullptr, &none) < 0 && errno == EINTR) {}
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_{};
  bool blocked_before_ = false;
  bool pending_before_ = false;
};

}  // namespace airhost::detail
