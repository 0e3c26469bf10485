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
