// stacks_command.cpp — `airhost stacks [ID] [--json] [--all-threads] [--sample DURATION]`:
// every rank's Python stacks of a live run, asked of its host through <run_dir>/host.sock (the
// host signals its ranks, collects, groups and answers: launch/watch/stacks_service.hpp); with
// --sample, where each rank spent its time over DURATION (launch/watch/stacks_sample.hpp). Bad input is one line and
// exit 2: no live run, an unknown or ambiguous id, a run that has ended (how, and where its
// last stacks are), a run of another user.
#include <dirent.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "airhost/exit_code.hpp"
#include "airhost/launch.hpp"
#include "base/errors.hpp"
#include "base/files.hpp"
#include "base/util.hpp"
#include "cli/commands.hpp"
#include "cli/config.hpp"
#include "cli/run_records.hpp"
#include "launch/watch/stacks_service.hpp"

namespace airhost::detail {
namespace {

// How long the host may take: the ranks' answers (3 s at most) and writing them down.
constexpr int kAnswerMs = 30000;

int owner_of(const std::string& dir) {
  struct stat st{};
  return ::stat(dir.c_str(), &st) == 0 ? static_cast<int>(st.st_uid) : -1;
}

std::string user_name(int uid) {
  if (passwd* pw = ::getpwuid(static_cast<uid_t>(uid))) return pw->pw_name;
  return "uid " + std::to_string(uid);
}

// The newest <dir>/stacks/<time>.txt, or "".
std::string last_stacks(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir((dir + "/stacks").c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      // sample-<time>.txt are profiles (--sample), not stacks.
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".txt") == 0 && n.rfind("sample-", 0) != 0) names.push_back(n);
    }
    ::closedir(d);
  }
  if (names.empty()) return "";
  return dir + "/stacks/" + *std::max_element(names.begin(), names.end());
}

std::string how_it_ended(const RunRecord& r) {
  std::string s = r.state;
  if (r.exit_code) s += " (exit " + std::to_string(*r.exit_code) + ")";
  const std::string last = last_stacks(r.dir);
  return s + (last.empty() ? "; no stacks were taken of it" : "; its last stacks: " + last);
}

// Connects, asks, reads the answer to EOF. Throws std::runtime_error when the host does not
// answer.
std::string ask_host(const RunRecord& run, const std::string& request, int answer_ms) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_un addr;
  int dir_fd = -1;
  std::size_t len = 0;
  try {
    len = socket_address(run.dir, kHostSocketName, addr, dir_fd);
  } catch (...) {
    ::close(fd);
    throw;
  }
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), static_cast<socklen_t>(len));
  const int err = errno;
  if (dir_fd >= 0) ::close(dir_fd);
  if (rc < 0) {
    ::close(fd);
    throw std::runtime_error("its host (pid " + std::to_string(run.host_pid) + ") does not answer on " + run.dir + "/" +
                             kHostSocketName + " (" + std::strerror(err) + ")");
  }
  write_all(fd, request);
  std::string answer;
  const bool whole = read_to_end(fd, answer, answer_ms);
  ::close(fd);
  if (!whole)
    throw std::runtime_error("its host (pid " + std::to_string(run.host_pid) + ") did not answer within " +
                             std::to_string(answer_ms / 1000) + " s");
  return answer;
}

// After the host did not answer: the run's record once it says the run ended (or its host is
// gone), read again for up to 5 s; nothing when the host still runs and still does not answer.
std::optional<RunRecord> ended_meanwhile(const RunRecord& run) {
  for (int i = 0; i < 50; ++i) {
    try {
      RunRecord now = read_run_record(run.dir);
      settle(now);
      if (is_ended(now.state) || now.state == "lost") return now;
    } catch (const std::exception&) {
      // A record being rewritten: read it again.
    }
    ::poll(nullptr, 0, 100);
  }
  return std::nullopt;
}

}  // namespace

int stacks_command(const std::vector<std::string>& args) {
  bool json = false, all_threads = false;
  std::string wanted;
  long sample_ms = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") json = true;
    else if (a == "--all-threads") all_threads = true;
    else if (a == "--sample" || a.rfind("--sample=", 0) == 0) {
      std::string text;
      if (a == "--sample") {
        if (i + 1 >= args.size()) throw ConfigError("--sample takes how long to sample, e.g. --sample 10s");
        text = args[++i];
      } else {
        text = a.substr(9);
      }
      sample_ms = static_cast<long>(parse_duration(text, "--sample").count());
      if (sample_ms < 100 || sample_ms > 3600 * 1000)
        throw ConfigError("--sample " + text + " is out of range: sample for 100ms to 1h (e.g. --sample 10s)");
    } else if (a.size() > 1 && a[0] == '-')
      throw ConfigError("unknown flag '" + a +
                        "' for airhost stacks; it takes a run id, --json, --all-threads and --sample DURATION");
    else if (!wanted.empty()) throw ConfigError("airhost stacks takes one run id, got '" + wanted + "' and '" + a + "'");
    else wanted = a;
  }
  const std::string root = default_runs_root();
  // As their run.json says and this node sees them: a live run here needs no word from Slurm
  // (one named by its id is settled alone below).
  const auto runs = list_runs(root, false);
  const int me = static_cast<int>(::geteuid());
  const RunRecord* run = nullptr;
  RunRecord named;
  if (wanted.empty()) {
    for (const auto& r : runs)
      if (r.state == "running" && owner_of(r.dir) == me) {
        run = &r;
        break;
      }
    if (!run) throw ConfigError("no live run of yours in " + root + " (airhost runs lists every run; airhost stacks ID names one)");
  } else {
    named = resolve_run(runs, wanted, root);
    settle(named);
    run = &named;
  }
  if (const int owner = owner_of(run->dir); owner != me && owner >= 0)
    throw ConfigError("run " + run->id + " belongs to " + user_name(owner) + "; airhost stacks shows your own runs only");
  if (is_ended(run->state)) throw ConfigError("run " + run->id + " has ended: " + how_it_ended(*run));
  if (run->state == "lost")
    throw ConfigError("run " + run->id + " is not running (" + run->problem + "): " + how_it_ended(*run));
  if (run->state == "starting") throw ConfigError("run " + run->id + " is starting (no run.json yet); ask again in a moment");
  if (run->state != "running")
    throw ConfigError("cannot tell whether run " + run->id + " runs here: " + run->problem +
                      (run->hostname.empty() ? "" : "; ask on " + run->hostname));

  std::string answer;
  try {
    answer = ask_host(*run,
                      std::string("stacks") + (json ? " json" : "") + (all_threads ? " all-threads" : "") +
                          (sample_ms ? " sample=" + std::to_string(sample_ms) : std::string()) + "\n",
                      kAnswerMs + static_cast<int>(sample_ms));
  } catch (const std::exception& e) {
    // The host takes its socket away as it ends, a moment before its run.json says so: a run
    // that ends while asked is said as ended, with how, not as a host that does not answer.
    if (const auto ended = ended_meanwhile(*run)) {
      std::fprintf(stderr, "airhost: run %s has ended meanwhile: %s\n", run->id.c_str(), how_it_ended(*ended).c_str());
      return to_int(ExitCode::generic_failure);
    }
    std::fprintf(stderr, "airhost: run %s: %s\n", run->id.c_str(), e.what());
    return to_int(ExitCode::generic_failure);
  }
  if (answer.empty() || answer.rfind("error: ", 0) == 0) {
    std::fprintf(stderr, "airhost: run %s: its host gave no %s%s%s", run->id.c_str(), sample_ms ? "sample" : "stacks", answer.empty() ? "" : ": ",
                 answer.empty() ? " (it may have ended meanwhile)\n" : answer.c_str() + 7);
    return to_int(ExitCode::generic_failure);
  }
  std::fputs(answer.c_str(), stdout);
  if (run->nnodes > 1 && !json)
    std::fprintf(stderr, "airhost: run %s has %d nodes: these are node %d's ranks (its run directory's)\n", run->id.c_str(),
                 run->nnodes, run->node_rank);
  return 0;
}

}  // namespace airhost::detail
