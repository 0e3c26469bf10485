// airhost-rank — the process of one rank: ties itself to the host, then runs Python.
//
//   airhost-rank --kind KIND --target T [--function F] [--python EXE] -- ARGS...
//
// The host passes the control channel as fd 3 (AIRHOST_CONTROL_FD) and its pid as
// AIRHOST_HOST_PID. Not meant to be started by hand.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "interpreter.hpp"
#include "rank_module.hpp"

namespace {

// A rank must never outlive its host, whatever kills the host (SIGKILL included): the
// kernel sends us SIGKILL when the parent dies. The getppid() check closes the race where
// the host died before prctl ran.
void die_with_host() {
  const char* host = std::getenv("AIRHOST_HOST_PID");
  if (!host) return;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != static_cast<pid_t>(std::atol(host))) _exit(137);
}

// The guard: a small process, forked before Python starts, that outlives the rank only to
// end the rank's process group. A rank leads its own group (the host starts it with
// setsid), and what it starts (DataLoader workers, servers, subprocesses) stays in that
// group. The host ends the group when the rank exits; but when the host itself is killed
// with SIGKILL, the kernel ends the rank (PR_SET_PDEATHSIG above) and nobody would end the
// rest. The guard learns of the rank's death the same way and SIGKILLs the group, itself
// included. It ignores the signals the host or a terminal sends the whole group (its
// parent is checked on each), holds none of the rank's files or pipes, and shows as
// "airhost-rank-guard" in ps.
void rename_process(int argc, char** argv, const char* name) {
  ::prctl(PR_SET_NAME, name);
  // /proc/PID/cmdline shows the argv strings in place (contiguous): overwrite them.
  char* begin = argv[0];
  char* end = argv[argc - 1] + std::strlen(argv[argc - 1]);
  const size_t room = static_cast<size_t>(end - begin);
  std::memset(begin, 0, room);
  std::memcpy(begin, name, std::min(room, std::strlen(name)));
}

[[noreturn]] void run_group_guard(pid_t rank, int argc, char** argv) {
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &wake, nullptr);  // taken with sigwait below, never by default
  for (int sig : {SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(sig, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  rename_process(argc, argv, "airhost-rank-guard");
  // Nothing of the rank's: the host's log pipes must reach EOF when the rank ends.
  const int null = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  while (::getppid() == rank) {  // also closes the race of a rank gone before prctl
    int sig = 0;
    ::sigwait(&wake, &sig);
  }
  ::kill(-rank, SIGKILL);
  _exit(0);
}

void start_group_guard(int argc, char** argv) {
  const pid_t rank = ::getpid();
  if (!std::getenv("AIRHOST_HOST_PID") || ::getpgrp() != rank) return;  // not started by a host
  const pid_t pid = ::fork();
  if (pid == 0) run_group_guard(rank, argc, argv);
  // pid < 0: the rank runs unguarded, as before the guard existed; the host still ends the
  // group whenever it sees the rank exit.
}

int usage(const char* why) {
  std::fprintf(stderr, "airhost-rank: %s\nairhost-rank is started by airhost, not by hand.\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  die_with_host();

  if (const char* fd = std::getenv("AIRHOST_CONTROL_FD")) {
    int cfd = std::atoi(fd);
    // Keep the channel out of processes the user's code execs; forked children
    // (DataLoader workers) still hold it, which is harmless.
    if (::fcntl(cfd, F_SETFD, FD_CLOEXEC) == 0) airhost::rank::control_fd = cfd;
  }
  start_group_guard(argc, argv);  // before any thread or interpreter exists: a cheap fork

  airhost::rank::RankArgs args;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--") { ++i; break; }
    else if (a == "--kind") ok = value(args.kind);
    else if (a == "--target") ok = value(args.target);
    else if (a == "--function") ok = value(args.function);
    else if (a == "--python") ok = value(args.python);
    else if (a == "--result-format") ok = value(args.result_format);
    else return usage(("unknown option " + a).c_str());
    if (!ok) return usage(("missing value for " + a).c_str());
  }
  for (; i < argc; ++i) args.args.emplace_back(argv[i]);
  if (args.kind.empty() || args.target.empty()) return usage("--kind and --target are required");
  return airhost::rank::run_interpreter(args);
}
