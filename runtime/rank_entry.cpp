// rank_entry.cpp — the Python half of airhost-rank, in a shared object of its own
// (libairhost-rank-py.so) that links no libpython: airhost-rank loads the libpython of the
// environment it was installed into first (runtime/libpython.cpp), then this, whose Python
// symbols resolve against it as an extension module's do. The same wheel thus runs over a
// venv of pyenv's Python, Debian's python3, conda or a uv-managed Python.
//
//   airhost-rank --kind KIND --target T [--function F] [--python EXE] -- ARGS...
//   airhost-rank --warm-server --socket PATH [--preload auto|none|m,m] [--python EXE] [--parent-pid PID]
//
// The only symbol it exports is airhost_rank_main (runtime/rank_entry.map): a wheel links its
// own C++ runtime in statically, and none of it may meet the one torch brings.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "interpreter.hpp"
#include "rank_entry.hpp"
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

int usage(const char* why) {
  std::fprintf(stderr, "airhost-rank: %s\nairhost-rank is started by airhost, not by hand.\n", why);
  return 2;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int airhost_rank_main(int argc, char** argv) {
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
