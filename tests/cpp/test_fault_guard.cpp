#include <doctest/doctest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/fault_guard.hpp"

using airhost::detail::read_guarded;

namespace {

// A page that faults when read, as the frames of a thread that popped them can.
struct ForbiddenPage {
  ForbiddenPage() { p = static_cast<char*>(::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)); }
  ~ForbiddenPage() { ::munmap(p, 4096); }
  char* p;
};

std::atomic<int> sink{0};
char* forbidden = nullptr;

void read_forbidden(void*) { sink += *static_cast<volatile char*>(forbidden); }
void read_fine(void* arg) { sink += *static_cast<int*>(arg); }

bool handled = false;
void on_usr1(int) { handled = read_guarded(read_forbidden, nullptr); }

// The handler itself (the C library may add its own restorer flag when an action is set again).
bool same_action(const struct sigaction& a, const struct sigaction& b) { return a.sa_sigaction == b.sa_sigaction; }

}  // namespace

TEST_CASE("a guarded read that faults returns false, and the handlers before it are back") {
  ForbiddenPage page;
  REQUIRE(page.p != MAP_FAILED);
  forbidden = page.p;
  struct sigaction before_segv{}, before_bus{}, after{};
  ::sigaction(SIGSEGV, nullptr, &before_segv);
  ::sigaction(SIGBUS, nullptr, &before_bus);

  int value = 7;
  const int sunk = sink;
  CHECK(read_guarded(read_fine, &value));
  CHECK(sink == sunk + 7);  // the read ran in this process's memory
  CHECK_FALSE(read_guarded(read_forbidden, nullptr));
  CHECK_FALSE(read_guarded(read_forbidden, nullptr));  // again: the jump back left nothing blocked
  CHECK(read_guarded(read_fine, &value));

  ::sigaction(SIGSEGV, nullptr, &after);
  CHECK(same_action(after, before_segv));
  ::sigaction(SIGBUS, nullptr, &after);
  CHECK(same_action(after, before_bus));
  sigset_t mask;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  CHECK_FALSE(sigismember(&mask, SIGSEGV));
}

TEST_CASE("from a thread that blocks every signal, the read still takes its own faults (#42: the stacks watcher's mask)") {
  // The task inherits its caller's mask; a fault it blocked would take the default action (on
  // kernels before 5.16, a core dump that ends every task sharing the memory: the rank).
  static std::atomic<int> blocked_in_read{-1};
  std::thread watcher([] {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    read_guarded([](void*) {
      sigset_t now;
      ::sigprocmask(SIG_BLOCK, nullptr, &now);
      blocked_in_read = sigismember(&now, SIGSEGV) + sigismember(&now, SIGBUS) + sigismember(&now, SIGILL) +
                        sigismember(&now, SIGFPE);
    }, nullptr);
  });
  watcher.join();
  CHECK(blocked_in_read == 0);
}

TEST_CASE("from a signal handler, as a rank asked for its stacks reads, a fault ends the read and not the process") {
  ForbiddenPage page;
  forbidden = page.p;
  struct sigaction sa{}, old{};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, &old);
  handled = true;
  ::raise(SIGUSR1);
  CHECK_FALSE(handled);
  ::raise(SIGUSR1);  // the handler can be entered again: its signal is unblocked
  CHECK_FALSE(handled);
  ::sigaction(SIGUSR1, &old, nullptr);
}

TEST_CASE("another thread's fault during a guarded read is not swallowed: the handler before the guard gets it") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ForbiddenPage page;
    forbidden = page.p;
    struct sigaction sa{};
    sa.sa_handler = [](int) { ::_exit(42); };  // what faulthandler would be: the crash reported
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, nullptr);
    static std::atomic<bool> guarding{false};
    std::thread other([] {
      while (!guarding) std::this_thread::yield();
      sink += *static_cast<volatile char*>(forbidden);  // a real crash of another thread
      ::_exit(3);
    });
    read_guarded([](void*) {
      guarding = true;
      ::sleep(10);  // the read in progress, while the other thread crashes
    }, nullptr);
    ::_exit(4);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 42);
}

TEST_CASE("a handler installed by another thread during a guarded read stays; one the read installs stays in the read") {
  static std::atomic<int> step{0};
  struct sigaction before{}, theirs{}, after{};
  ::sigaction(SIGSEGV, nullptr, &before);
  theirs.sa_handler = [](int) { ::_exit(43); };  // what faulthandler.enable() installs, say
  sigemptyset(&theirs.sa_mask);
  std::thread other([&] {
    while (step < 1) std::this_thread::yield();
    ::sigaction(SIGSEGV, &theirs, nullptr);
    step = 2;
  });
  CHECK(read_guarded([](void*) {
    step = 1;
    while (step < 2) {}  // the read in progress while the other thread installs its handler
    struct sigaction mine{};
    mine.sa_handler = SIG_IGN;
    ::sigaction(SIGBUS, &mine, nullptr);  // the read's own disposition, not the process's
  }, nullptr));
  other.join();
  ::sigaction(SIGSEGV, nullptr, &after);
  CHECK(same_action(after, theirs));  // not undone
  ::sigaction(SIGBUS, nullptr, &after);
  const bool ignored = after.sa_handler == SIG_IGN;
  CHECK_FALSE(ignored);
  ::sigaction(SIGSEGV, &before, nullptr);
}

TEST_CASE("a read that never ends is stopped at its limit, and the next one runs") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(read_guarded([](void*) { for (;;) ::pause(); }, nullptr, 200));
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(200));
  CHECK(took < std::chrono::seconds(3));
  int value = 1;
  CHECK(read_guarded(read_fine, &value));
}

TEST_CASE("a fault in a guarded read leaves no core dump and sends the process no signal") {
  // SIGCHLD would reach a process that handles it (Python's subprocess users, an event loop).
  static std::atomic<int> chld{0};
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) { ++chld; };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGCHLD, &sa, &old);
  ForbiddenPage page;
  forbidden = page.p;
  CHECK_FALSE(read_guarded(read_forbidden, nullptr));
  int value = 1;
  CHECK(read_guarded(read_fine, &value));
  CHECK(chld == 0);
  ::sigaction(SIGCHLD, &old, nullptr);
}
