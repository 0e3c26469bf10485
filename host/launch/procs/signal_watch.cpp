#include "launch/procs/signal_watch.hpp"

#include <pthread.h>

namespace airhost::detail {

void SignalWatch::start(uv_loop_t* loop, std::function<void(int sig)> on_signal) {
  on_signal_ = std::move(on_signal);
  for (int sig : kHandledSignals) {
    ::sigaction(sig, nullptr, &saved_[count_]);
    uv_signal_t& h = handles_[count_++];
    uv_signal_init(loop, &h);
    h.data = this;
    uv_signal_start(&h, [](uv_signal_t* s, int signum) { static_cast<SignalWatch*>(s->data)->on_signal_(signum); }, sig);
  }
}

void SignalWatch::close() {
  if (!count_) return;
  sigset_t block, old;
  sigemptyset(&block);
  for (int sig : kHandledSignals) sigaddset(&block, sig);
  ::pthread_sigmask(SIG_BLOCK, &block, &old);
  for (int i = 0; i < count_; ++i) {
    uv_close(reinterpret_cast<uv_handle_t*>(&handles_[i]), nullptr);
    ::sigaction(kHandledSignals[i], &saved_[i], nullptr);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  count_ = 0;
}

}  // namespace airhost::detail
