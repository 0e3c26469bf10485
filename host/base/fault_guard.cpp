// fault_guard.cpp — see fault_guard.hpp.
#include "base/fault_guard.hpp"

#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace airhost::detail {
namespace {

constexpr int kFaults[] = {SIGSEGV, SIGBUS};
struct sigaction previous[2];
sigjmp_buf back;
std::atomic<long> guarded_thread{0};  // the thread inside read_guarded, 0 when none

long this_thread() { return ::syscall(SYS_gettid); }

void put_back(int sig) {
  for (int i = 0; i < 2; ++i)
    if (kFaults[i] == sig) ::sigaction(sig, &previous[i], nullptr);
}

void on_fault(int sig, siginfo_t* info, void*) {
  if (guarded_thread.load() == this_thread() && info && info->si_code > 0) siglongjmp(back, 1);
  // Another thread's fault, or a SIGSEGV sent by someone: not ours to swallow. The handler
  // before ours takes it: a fault happens again when this returns; a sent signal is sent again.
  put_back(sig);
  if (!info || info->si_code <= 0) ::raise(sig);
}

}  // namespace

bool read_guarded(void (*read)(void*), void* arg) noexcept {
  long none = 0;
  const long me = this_thread();
  if (!guarded_thread.compare_exchange_strong(none, me)) return false;
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 2; ++i) ::sigaction(kFaults[i], &sa, &previous[i]);
  volatile bool whole = false;
  // savemask=1: the jump back restores this thread's mask (SIGSEGV is blocked in its handler).
  if (sigsetjmp(back, 1) == 0) {
    read(arg);
    whole = true;
  }
  for (int i = 0; i < 2; ++i) ::sigaction(kFaults[i], &previous[i], nullptr);
  guarded_thread.store(0);
  return whole;
}

}  // namespace airhost::detail
