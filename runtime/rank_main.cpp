// airhost-rank — the process of one rank: ties itself to the host, then runs Python.
//
//   airhost-rank --kind KIND --target T [--function F] [--python EXE] -- ARGS...
//   airhost-rank --guard      the run's group guard (host/launch/group_guard.hpp)
//   airhost-rank --warm-server --socket PATH [--preload auto|none|m,m] [--python EXE] [--parent-pid PID]
//                             a warm server (runtime/warm.py, host/launch/warm_starter.hpp)
//
// The host passes the control channel as fd 3 (AIRHOST_CONTROL_FD) and its pid as
// AIRHOST_HOST_PID. Not meant to be started by hand.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "interpreter.hpp"
#include "launch/proc_tree.hpp"
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

// The run's group guard: it learns each rank's process group from the host ("+PGID\n" when
// the rank starts, "-PGID\n" once it has exited and its group was ended) on stdin, and the
// processes of the run that left those groups ("pPID START\n", "qPID\n" once gone). If the
// host dies first (stdin reaches EOF, or the parent-death signal), it ends all of them, and
// every process whose environment holds the run's AIRHOST_RUN_ID, with whatever is below
// them: servers, subprocesses, workers and daemons that never look at their parent die with
// the run (host/launch/group_guard.hpp). "x\n" means the run ended normally: nothing to end. The
// host ends the guard when the run ends.
int run_guard() {
  const pid_t host = ::getppid();
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &term, nullptr);
  // SIGUSR1/SIGUSR2: a scheduler's warning, which Slurm sends to every process of the step.
  for (int sig : {SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  const int sfd = ::signalfd(-1, &term, SFD_CLOEXEC);
  std::set<long> groups;
  std::map<int, std::uint64_t> escaped;
  bool done = false;
  std::string pending;
  while (!done && ::getppid() == host) {  // checked first too: the host may have died before prctl
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (::poll(fds, sfd >= 0 ? 2 : 1, sfd >= 0 ? -1 : 1000) < 0 && errno != EINTR) break;
    if (sfd >= 0 && (fds[1].revents & POLLIN)) {
      signalfd_siginfo info;  // a SIGTERM: the parent-death signal only if the host is gone
      [[maybe_unused]] const ssize_t n = ::read(sfd, &info, sizeof info);
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // EOF: the host is gone
      pending.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
        const char op = pending[0];
        char* end = nullptr;
        const long id = std::strtol(pending.c_str() + 1, &end, 10);
        if (op == 'x') done = true;
        if (id <= 1) continue;
        if (op == '+') groups.insert(id);
        if (op == '-') groups.erase(id);
        if (op == 'p') escaped[static_cast<int>(id)] = std::strtoull(end, nullptr, 10);
        if (op == 'q') escaped.erase(static_cast<int>(id));
      }
    }
  }
  if (done) return 0;
  airhost::detail::RunMatch run;
  for (const auto& p : airhost::detail::list_processes())
    if (groups.count(p.pgid)) run.roots.insert(p.pid);
  run.known = escaped;
  if (const char* id = std::getenv("AIRHOST_RUN_ID"); id && *id) run.env_entry = std::string("AIRHOST_RUN_ID=") + id;
  run.exclude.insert(static_cast<int>(::getpid()));
  airhost::detail::kill_run(run);
  for (long pgid : groups) ::kill(static_cast<pid_t>(-pgid), SIGKILL);
  return 0;
}

int usage(const char* why) {
  std::fprintf(stderr, "airhost-rank: %s\nairhost-rank is started by airhost, not by hand.\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--guard") == 0) return run_guard();
  if (argc >= 2 && std::strcmp(argv[1], "--warm-server") == 0) {
    airhost::rank::WarmArgs warm;
    warm.preload = "auto";
    for (int j = 2; j < argc; ++j) {
      const std::string a = argv[j];
      if (j + 1 >= argc) return usage(("missing value for " + a).c_str());
      const std::string v = argv[++j];
      if (a == "--socket") warm.socket = v;
      else if (a == "--preload") warm.preload = v;
      else if (a == "--python") warm.python = v;
      else if (a == "--parent-pid") warm.parent_pid = v;
      else return usage(("unknown option " + a).c_str());
    }
    if (warm.socket.empty()) return usage("--warm-server needs --socket");
    return airhost::rank::run_warm_server(warm);
  }
  die_with_host();

  if (const char* fd = std::getenv("AIRHOST_CONTROL_FD")) {
    int cfd = std::atoi(fd);
    // Keep the channel out of processes the user's code execs; forked children
    // (DataLoader workers, daemons) still hold it, but never write to it (control_pid).
    if (::fcntl(cfd, F_SETFD, FD_CLOEXEC) == 0) {
      airhost::rank::control_fd = cfd;
      airhost::rank::control_pid = ::getpid();
    }
  }

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
