// airhost-rank — the process of one rank: ties itself to the host, then runs Python.
//
//   airhost-rank --kind KIND --target T [--function F] [--python EXE] -- ARGS...
//   airhost-rank --guard      the run's group guard (host/launch/procs/group_guard.hpp)
//   airhost-rank --warm-server --socket PATH [--preload auto|none|m,m] [--python EXE] [--parent-pid PID]
//                             a warm server (runtime/warm.py, host/launch/rank/warm_starter.hpp)
//
// The host passes the control channel as fd 3 (AIRHOST_CONTROL_FD) and its pid as
// AIRHOST_HOST_PID. Not meant to be started by hand.
//
// This executable links no libpython, so that one wheel runs over whichever Python it was
// installed into: it loads that Python's libpython (runtime/libpython.cpp), then the Python
// half of the rank, libairhost-rank-py.so (runtime/rank_entry.cpp). The guard needs neither.
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "base/built_for.hpp"
#include "launch/procs/proc_tree.hpp"
#include "libpython.hpp"
#include "rank_entry.hpp"

namespace {

// The run's group guard: it learns each rank's process group from the host ("+PGID\n" when
// the rank starts, "-PGID\n" once it has exited and its group was ended) on stdin, and the
// processes of the run that left those groups ("pPID START\n", "qPID\n" once gone). If the
// host dies first (stdin reaches EOF, or the parent-death signal), it ends all of them, and
// every process whose environment holds the run's AIRHOST_RUN_ID, with whatever is below
// them: servers, subprocesses, workers and daemons that never look at their parent die with
// the run (host/launch/procs/group_guard.hpp). "x\n" means the run ended normally: nothing to end. The
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

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

bool is_executable(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The interpreter the ranks use: --python, else the python3 beside airhost-rank in the
// environment's bin/ (where pip put both).
std::string python_of(int argc, char** argv, const std::string& dir) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "--python") == 0) return argv[i + 1];
  }
  for (const char* name : {"/python3", "/python"})
    if (is_executable(dir + name)) return dir + name;
  return "";
}

// A rank that cannot start says why in one line of its log and exits 1, as a Python that
// cannot start would.
int cannot_start(const std::string& why) {
  std::fprintf(stderr, "airhost-rank: cannot start Python: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--guard") == 0) return run_guard();
  // A scheduler's warning (SIGUSR1/SIGUSR2, which the host passes on to every rank) that comes
  // while the rank starts, before its interpreter installs the handler that records it
  // (bootstrap.py), must neither kill it nor be lost: blocked until then, it waits, and the
  // bootstrap unblocks it once its handler is in place. (Before this line the host holds it
  // back: supervisor_run.cpp, forward_warning.)
  sigset_t warnings;
  sigemptyset(&warnings);
  sigaddset(&warnings, SIGUSR1);
  sigaddset(&warnings, SIGUSR2);
  ::sigprocmask(SIG_BLOCK, &warnings, nullptr);
  const std::string dir = self_dir();
  const auto search = airhost::rank::libpython_search(python_of(argc, argv, dir), airhost::detail::built_python_version());
  if (const std::string why = airhost::rank::load_libpython(search); !why.empty()) return cannot_start(why);
  std::string tried, error;
  for (const auto& path : airhost::rank::rank_library_candidates(dir)) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return cannot_start(path + " does not load (" + ::dlerror() + "); reinstall airhost");
    auto entry = reinterpret_cast<airhost_rank_main_fn>(::dlsym(lib, "airhost_rank_main"));
    if (!entry) return cannot_start(path + " has no airhost_rank_main; reinstall airhost");
    return entry(argc, argv);
  }
  return cannot_start("the rank runtime's Python half is missing (looked for " + tried + "); reinstall airhost");
}
