// warm_command.cpp — `airhost warm start|stop|status`: the user's warm server
// (launch/rank/warm_starter.hpp says what it is and how ranks are forked from it).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "base/util.hpp"
#include "cli/commands.hpp"
#include "launch/run/run_dir.hpp"
#include "launch/rank/warm_starter.hpp"

namespace airhost::detail {
namespace {

std::string rank_binary() {
  auto env = getenv_or("AIRHOST_RANK_BINARY", "");
  if (!env.empty()) return env;
  return dirname_of(executable_path()) + "/airhost-rank";
}

std::string describe(const WarmServerInfo& info, const std::string& socket) {
  return "warm server pid " + std::to_string(info.pid) + " on " + socket + ": preloaded " +
         (info.modules.empty() ? "nothing" : info.modules) + " (preload " + info.preload + "), python " +
         info.python + ", airhost " + info.version + ", up " + info.uptime + " s, " + std::to_string(info.ranks) +
         " rank(s) running";
}

// The server of `socket` if one answers; nullopt with `why` otherwise.
std::optional<WarmServerInfo> probe(const std::string& socket, std::string& why) {
  try {
    const int fd = warm_connect(socket);
    try {
      auto info = warm_hello(fd, {});
      ::close(fd);
      return info;
    } catch (...) {
      ::close(fd);
      throw;
    }
  } catch (const WarmUnavailable& e) {
    why = e.what();
    return std::nullopt;
  }
}

int warm_start(const HostOptions& opts, const std::string& socket) {
  const std::string preload = opts.settings.preload.value_or("auto");
  const std::string python = opts.settings.python.value_or(default_python());
  std::string why;
  if (auto info = probe(socket, why)) {
    std::fprintf(stderr, "airhost: a %s\n", describe(*info, socket).c_str());
    if (info->preload != preload) {
      std::fprintf(stderr, "airhost: it has preload %s, not %s; run airhost warm stop first\n", info->preload.c_str(),
                   preload.c_str());
      return 1;
    }
    return 0;
  }
  struct stat st{};
  if (::lstat(socket.c_str(), &st) == 0) {
    if (st.st_uid != ::getuid()) {
      std::fprintf(stderr, "airhost: %s belongs to uid %u, not to you; remove it by hand if it is expected\n",
                   socket.c_str(), st.st_uid);
      return 1;
    }
    ::unlink(socket.c_str());  // a stale socket of ours: its server is gone
  }
  const std::string dir = dirname_of(socket);
  make_dirs(dir);
  ::chmod(dir.c_str(), 0700);
  const std::string log = dir + "/warm.log";
  const std::string exe = rank_binary();
  std::vector<std::string> env;
  bool has_omp = false;
  for (auto& e : current_environment()) {
    if (e.rfind("PYTHONUNBUFFERED=", 0) == 0) continue;
    has_omp |= e.rfind("OMP_NUM_THREADS=", 0) == 0;
    env.push_back(e);
  }
  // What every rank gets (rank_env.cpp), so the preloaded libraries size their pools alike.
  if (!has_omp) env.push_back("OMP_NUM_THREADS=1");
  env.push_back("PYTHONUNBUFFERED=1");
  std::vector<std::string> args = {exe, "--warm-server", "--socket", socket, "--preload", preload};
  if (!python.empty()) args.insert(args.end(), {"--python", python});
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("airhost: fork");
    return 1;
  }
  if (pid == 0) {
    ::setsid();  // a session of its own: it outlives this command and the terminal's signals
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execve(exe.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  const double deadline = now_seconds() + 300;
  for (;;) {
    if (auto info = probe(socket, why)) {
      std::fprintf(stderr, "airhost: started %s\n", describe(*info, socket).c_str());
      return 0;
    }
    if (why.rfind("warm server refused: ", 0) == 0) {
      // Up, but not safe to fork (a preload started a thread, say): launches will start cold.
      std::fprintf(stderr, "airhost: warm server pid %d started (log %s), but it %s; launches start cold "
                   "until it is restarted with another preload\n", static_cast<int>(pid), log.c_str(),
                   why.substr(12).c_str());
      return 0;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid || now_seconds() > deadline) {
      if (now_seconds() > deadline) ::kill(pid, SIGKILL);
      std::string text;
      run_capture("tail -n 5 " + shell_quote(log), text);
      std::fprintf(stderr, "airhost: the warm server did not start (log %s):\n%s", log.c_str(), text.c_str());
      return 1;
    }
    ::usleep(50000);
  }
}

}  // namespace

int warm_command(const HostOptions& opts) {
  const std::string socket = default_warm_socket();
  if (opts.warm_action == "start") return warm_start(opts, socket);
  std::string why;
  if (opts.warm_action == "status") {
    if (auto info = probe(socket, why)) {
      std::printf("%s\n", describe(*info, socket).c_str());
      return 0;
    }
    std::printf("no usable warm server: %s\n", why.c_str());
    return 1;
  }
  try {  // stop
    const int fd = warm_connect(socket);
    const int pid = warm_stop(fd);
    ::close(fd);
    std::fprintf(stderr, "airhost: warm server %d stopping (it exits once its ranks have)\n", pid);
  } catch (const WarmUnavailable& e) {
    std::fprintf(stderr, "airhost: %s; nothing to stop\n", e.what());
  }
  return 0;
}

}  // namespace airhost::detail
