// fault_guard.cpp — see fault_guard.hpp.
//
// Why a task and not a SIGSEGV handler around the read: signal dispositions belong to the
// whole process, so a guard that installs its handler for the read and restores the previous
// one after undoes a handler installed meanwhile, and one that stays installed must chain to
// others' handlers (faulthandler restores its predecessor and re-raises, which loops). A task
// cloned without CLONE_SIGHAND has its own copy of the dispositions: it can catch its own
// faults without anyone else seeing it.
#include "base/fault_guard.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <initializer_list>

#if defined(__SANITIZE_ADDRESS__)
#define AIRHOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AIRHOST_ASAN 1
#endif
#endif
#ifdef AIRHOST_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace airhost::detail {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kAltStack = 64 * 1024;    // where the task's fault handler runs
constexpr std::size_t kStack = 1024 * 1024;     // the read's own stack, a guard page below it
constexpr int kFaultExit = 77;                  // the task's exit status when its read faulted

std::atomic<bool> busy{false};
std::atomic<char*> region{nullptr};  // [guard page][stack][alternate signal stack], made once

struct Job {
  void (*read)(void*);
  void* arg;
  char* altstack;
};

// AddressSanitizer instruments each call to a noreturn function (_exit) with a request to
// unpoison the rest of the current thread's stack; on this task's stacks, which are none of
// its threads', it refuses and warns ("ignoring requested __asan_handle_no_return"). The two
// functions that end the task are therefore not instrumented; read_guarded unpoisons both
// stacks itself once the task is gone.
#ifdef AIRHOST_ASAN
#define AIRHOST_NO_ASAN __attribute__((no_sanitize("address")))
#else
#define AIRHOST_NO_ASAN
#endif

AIRHOST_NO_ASAN void on_fault(int) { ::_exit(kFaultExit); }

AIRHOST_NO_ASAN int task_main(void* p) {
  const Job& job = *static_cast<Job*>(p);
  // This task's own dispositions (a copy, not shared): a fault ends the task with a status,
  // without a core dump of the process's whole memory and without anyone's crash report.
  stack_t alt{};
  alt.ss_sp = job.altstack;
  alt.ss_size = kAltStack;
  ::sigaltstack(&alt, nullptr);
  struct sigaction sa{};
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigset_t faults;
  sigemptyset(&faults);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    ::sigaction(sig, &sa, nullptr);
    sigaddset(&faults, sig);
  }
  // The task starts with the mask of the thread that cloned it, which may block every signal
  // (a watcher thread does): a fault it blocks would not reach the handler above but take the
  // default action, and a task that shares the rank's memory dumping core ends the whole rank
  // on kernels before 5.16. Whatever the caller blocks, the task takes its own faults.
  ::sigprocmask(SIG_UNBLOCK, &faults, nullptr);
  const struct rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);  // per process: the rank's own limit is unchanged
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the waiting thread gone (its process died): so is this
  job.read(job.arg);
  ::_exit(0);
}

char* stack_region() {
  char* r = region.load();
  if (r) return r;
  void* m = ::mmap(nullptr, kPage + kStack + kAltStack, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  r = static_cast<char*>(m);
  ::mprotect(r, kPage, PROT_NONE);  // an overflowing read faults instead of writing past
  region.store(r);
  return r;
}

void nap_us(long us) {
  struct timespec t{us / 1000000, (us % 1000000) * 1000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

}  // namespace

bool read_guarded(void (*read)(void*), void* arg, int limit_ms) noexcept {
  bool none = false;
  if (!busy.compare_exchange_strong(none, true)) return false;
  const int saved = errno;
  bool whole = false;
  if (char* r = stack_region()) {
    Job job{read, arg, r + kPage + kStack};
    // No exit signal: the process gets no SIGCHLD, and a waitpid(-1) of its own never reaps
    // this task (only __WCLONE waits for it).
    const int flags = CLONE_VM | CLONE_FILES | CLONE_FS | CLONE_UNTRACED;
    const pid_t task = ::clone(task_main, r + kPage + kStack, flags, &job);
    if (task > 0) {
      int status = 0;
      // Naps that grow from 20 us to 5 ms, not a blocking wait (no timer is safe to arm in a
      // signal handler): a read that never ends (a cycle in memory being rewritten) is killed
      // at the limit instead of keeping this thread.
      long waited_us = 0;
      pid_t got = 0;
      for (long nap = 20;; nap = nap < 5000 ? nap * 2 : 5000) {
        got = ::waitpid(task, &status, __WCLONE | WNOHANG);
        if (got == task || (got < 0 && errno != EINTR)) break;
        if (waited_us >= limit_ms * 1000L) {
          ::kill(task, SIGKILL);
          while (::waitpid(task, &status, __WCLONE) < 0 && errno == EINTR) {}
          got = -1;
          break;
        }
        nap_us(nap);
        waited_us += nap;
      }
      whole = got == task && WIFEXITED(status) && WEXITSTATUS(status) == 0;
#ifdef AIRHOST_ASAN
      // The task's frames never returned (it ended in _exit): their redzones would stay
      // poisoned for the next read's frames at the same addresses.
      __asan_unpoison_memory_region(r + kPage, kStack + kAltStack);
#endif
    }
  }
  errno = saved;
  busy.store(false);
  return whole;
}

}  // namespace airhost::detail
