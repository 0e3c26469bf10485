#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <set>
#include <thread>

#include "launch/procs/proc_tree.hpp"

using namespace airhost::detail;

namespace {

// Gone, or a zombie waiting for a parent that is not us: ended either way.
bool ended(int pid) {
  ProcStat s;
  return !read_proc_stat(pid, s) || s.state == 'Z';
}

bool ended_soon(int pid) {
  for (int i = 0; i < 200 && !ended(pid); ++i) ::usleep(10000);
  return ended(pid);
}

}  // namespace

TEST_CASE("read_proc_stat reads this process's parent, group, session and start time") {
  ProcStat s;
  REQUIRE(read_proc_stat(::getpid(), s));
  CHECK(s.pid == ::getpid());
  CHECK(s.ppid == ::getppid());
  CHECK(s.pgid == ::getpgid(0));
  CHECK(s.sid == ::getsid(0));
  CHECK(s.start > 0);
  CHECK(s.state == 'R');
  CHECK_FALSE(read_proc_stat(-1, s));
}

TEST_CASE("match_run follows the tree below roots, known pids of the same start time, and stops at exclusions") {
  // 10 ← 11 ← 12 (a zombie: not listed) ; 11 ← 13 ← 14 (13 excluded) ; 20 (known) ← 21 ; 30 unrelated
  std::vector<ProcStat> all = {
      {10, 1, 10, 10, 'S', 100}, {11, 10, 11, 11, 'S', 101}, {12, 11, 11, 11, 'Z', 102},
      {13, 11, 13, 13, 'S', 103}, {14, 13, 13, 13, 'S', 104}, {20, 1, 20, 20, 'S', 200},
      {21, 20, 20, 20, 'S', 201}, {30, 1, 30, 30, 'S', 300}, {40, 1, 40, 40, 'S', 400}};
  RunMatch m;
  m.roots = {10};
  m.known = {{20, 200}, {40, 999}};  // 40 has another start time: a reused pid, not ours
  m.exclude = {13};
  std::set<int> found;
  for (const auto& p : match_run(all, m)) found.insert(p.pid);
  CHECK(found == std::set<int>{10, 11, 20, 21});
}

TEST_CASE("environ_has matches a whole KEY=VALUE of a process's initial environment") {
  const char* path = std::getenv("PATH");
  REQUIRE(path);
  CHECK(environ_has(::getpid(), std::string("PATH=") + path));
  CHECK_FALSE(environ_has(::getpid(), "PATH="));
  CHECK_FALSE(environ_has(::getpid(), "AIRHOST_NO_SUCH_VARIABLE=1"));
}

TEST_CASE("kill_run ends a tree whose members left its session, the daemon whose parent exited included") {
  // child (new session) → daemon: fork, setsid, fork, the middle exits; the daemon is an
  // orphan outside the child's tree, found only by its environment.
  const std::string mark = "AIRHOST_TEST_PROC_TREE=" + std::to_string(::getpid()) + "-" + std::to_string(std::time(nullptr));
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::setsid();
    if (::fork() == 0) {
      ::setsid();
      if (::fork() == 0) {
        // the daemon: exec so that its initial environment is the one with the mark
        char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"), nullptr};
        char* envp[] = {const_cast<char*>(mark.c_str()), nullptr};
        ::close(fds[0]);
        ::close(fds[1]);
        ::execve("/bin/sleep", argv, envp);
        _exit(127);
      }
      _exit(0);
    }
    ::close(fds[0]);
    (void)::write(fds[1], "k", 1);  // ready once the daemon has been forked
    ::close(fds[1]);
    ::pause();
    _exit(0);
  }
  ::close(fds[1]);
  char c;
  REQUIRE(::read(fds[0], &c, 1) == 1);
  ::close(fds[0]);
  // Find the daemon by its mark (its exec may still be on its way).
  int daemon = 0;
  for (int i = 0; i < 200 && !daemon; ++i) {
    for (const auto& p : list_processes())
      if (p.state != 'Z' && environ_has(p.pid, mark)) daemon = p.pid;
    if (!daemon) ::usleep(10000);
  }
  REQUIRE(daemon > 0);

  RunMatch m;
  m.roots = {child};
  m.env_entry = mark;
  m.exclude = {static_cast<int>(::getpid())};
  const auto killed = kill_run(m);
  CHECK(killed.count(child));
  CHECK(killed.count(daemon));
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  CHECK(ended_soon(daemon));
}

TEST_CASE("list_tree reads a run's own tree from the child lists, threads' children too, and nothing beside it") {
  // #42: the periodic sweep read every process of the machine (256 hosts on one machine: 256 x
  // 256 reads a second). list_tree walks /proc/<pid>/task/<tid>/children from its seeds.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    int grandchild = 0;
    // A grandchild forked by a second thread: its parent is that thread, listed in its own task.
    std::thread([&] {
      grandchild = ::fork();
      if (grandchild == 0) {
        ::pause();
        _exit(0);
      }
    }).join();
    (void)::write(fds[1], &grandchild, sizeof grandchild);
    ::close(fds[1]);
    ::pause();
    _exit(0);
  }
  ::close(fds[1]);
  int grandchild = 0;
  REQUIRE(::read(fds[0], &grandchild, sizeof grandchild) == sizeof grandchild);
  ::close(fds[0]);
  const pid_t stranger = ::fork();  // not below the seed
  if (stranger == 0) {
    ::pause();
    _exit(0);
  }

  std::set<int> found;
  for (const auto& p : list_tree({child})) found.insert(p.pid);
  CHECK(found == std::set<int>{child, grandchild});
  // The same as the whole of /proc, matched from the same root.
  RunMatch m;
  m.roots = {child};
  std::set<int> matched;
  for (const auto& p : match_run(list_tree({child}), m)) matched.insert(p.pid);
  std::set<int> everything;
  for (const auto& p : match_run(list_processes(), m)) everything.insert(p.pid);
  CHECK(matched == everything);

  for (int pid : {static_cast<int>(child), grandchild, static_cast<int>(stranger)}) ::kill(pid, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::waitpid(stranger, nullptr, 0);
  CHECK(ended_soon(grandchild));
}
