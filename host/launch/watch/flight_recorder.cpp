#include "launch/watch/flight_recorder.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/sigpipe.hpp"
#include "base/util.hpp"
#include "launch/watch/flight_recorder_py.hpp"  // generated from runtime/flight_recorder.py

extern char** environ;

namespace airhost::detail {

bool has_flight_recorder_dumps(const std::string& stacks_dir, const std::string& prefix) {
  DIR* d = ::opendir(stacks_dir.c_str());
  if (!d) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    bool digits = true;
    for (std::size_t i = prefix.size(); i < n.size(); ++i) digits &= std::isdigit(static_cast<unsigned char>(n[i])) != 0;
    if (digits) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

namespace {

// The N of `prefix`N`suffix`, or -1.
int rank_of(const std::string& name, const std::string& prefix, const std::string& suffix) {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  for (char c : digits)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  return digits.size() > 9 ? -1 : std::atoi(digits.c_str());
}

}  // namespace

std::vector<int> poke_flight_recorder(const std::string& stacks_dir, const std::string& prefix) {
  std::vector<int> asked;
  DIR* d = ::opendir(stacks_dir.c_str());
  if (!d) return asked;
  while (dirent* e = ::readdir(d)) {
    const int rank = rank_of(e->d_name, prefix, ".pipe");
    if (rank < 0) continue;
    const std::string path = stacks_dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    // O_NONBLOCK: with no reader the open fails (ENXIO) instead of waiting for one.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    {
      SigpipeGuard no_sigpipe;  // its reader may close it between the open and the write
      if (::write(fd, "1", 1) == 1) asked.push_back(rank);
    }
    ::close(fd);
  }
  ::closedir(d);
  std::sort(asked.begin(), asked.end());
  return asked;
}

std::vector<int> flight_recorder_dumped(const std::string& stacks_dir, const std::string& prefix,
                                        const std::vector<int>& ranks, double since) {
  std::vector<int> done;
  for (int r : ranks) {
    struct stat st {};
    const std::string path = stacks_dir + "/" + prefix + std::to_string(r);
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const double mtime = static_cast<double>(st.st_mtim.tv_sec) + static_cast<double>(st.st_mtim.tv_nsec) / 1e9;
    if (mtime + 1.0 >= since) done.push_back(r);  // a second's slack: file systems round times
  }
  return done;
}

std::string flight_recorder_summary(const std::string& python, const std::string& stacks_dir,
                                    const std::string& prefix, std::chrono::milliseconds limit) {
  if (!has_flight_recorder_dumps(stacks_dir, prefix)) return "";
  const std::string why_not = "Flight recorder: dumps are in " + stacks_dir + " but could not be summarized (";
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return why_not + std::strerror(errno) + ")\n";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  const std::string py = python.empty() ? "python3" : python;
  std::vector<const char*> argv{py.c_str(), "-I", "-c", kFlightRecorderSource, stacks_dir.c_str(), prefix.c_str(), nullptr};
  // Out of the terminal's signals (a group of its own), with an empty signal mask: a helper
  // of the host's, ended by the host (the limit below), as the MLflow helper is.
  const HelperSpawnAttr attr;
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, py.c_str(), &actions, attr.get(), const_cast<char* const*>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return why_not + py + ": " + std::strerror(rc) + ")\n";
  }
  std::string text;
  const double deadline = now_seconds() + static_cast<double>(limit.count()) / 1000.0;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    const int left = static_cast<int>((deadline - now_seconds()) * 1000);
    pollfd p{out[0], POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) == 0) {
      timed_out = true;
      break;
    }
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < (1u << 16)) text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return why_not + "it took over " + std::to_string(limit.count() / 1000) + " s)\n";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    const auto nl = text.rfind('\n');
    return why_not + (nl == std::string::npos ? text : text.substr(nl + 1)) + ")\n";
  }
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

}  // namespace airhost::detail
