#include "launch/rank/warm_starter.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "airhost/launch.hpp"
#include "base/util.hpp"

namespace airhost::detail {
namespace {

constexpr int kReplyTimeoutMs = 30000;  // a server that takes longer to fork is hung

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '\0';
    out += parts[i];
  }
  return out;
}

void send_frame(int fd, WarmKind kind, const Fields& fields, const int* fds = nullptr, int nfds = 0) {
  send_with_fds(fd, encode_frame(static_cast<std::uint16_t>(kind), encode_fields(fields)), fds, nfds,
                "warm server connection");
}

// Blocks (up to the timeout) until a whole frame is in `decoder`; false at EOF.
bool read_frame(int fd, FrameDecoder& decoder, Frame& out, int timeout_ms = kReplyTimeoutMs) {
  for (;;) {
    if (auto f = decoder.next()) {
      out = std::move(*f);
      return true;
    }
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) throw WarmUnavailable("the warm server did not answer within " + std::to_string(timeout_ms / 1000) + " s");
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    decoder.feed({buf, static_cast<std::size_t>(n)});
  }
}

int to_int(const std::string& s) { return s.empty() ? 0 : std::atoi(s.c_str()); }

std::string read_text(const char* path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// What a process inherits from its parent besides the environment, and a cold rank so from
// this host: umask, CPU affinity, resource limits, nice value. A forked rank has the
// server's instead, so the server refuses a launch whose differ (runtime/warm.py computes
// the same strings for itself). Read, never changed: umask(2) would have to set it to read
// it, racing the caller's other threads; /proc/self/status shows it. Not the cgroup: every
// ssh login is a cgroup (a systemd scope) of its own, so comparing it would refuse nearly
// every launch from another terminal; a warm rank is in the server's (docs/internals.md says so).
Fields process_attributes() {
  Fields f;
  const std::string status = read_text("/proc/self/status");
  if (auto at = status.find("\nUmask:"); at != std::string::npos) {
    std::istringstream line(status.substr(at + 7));
    std::string value;
    line >> value;
    f["umask"] = value;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    std::string cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(cpu);
    f["affinity"] = cpus;
  }
  std::string limits;
  for (int r = 0; r < RLIMIT_NLIMITS; ++r) {
    rlimit rl{};
    if (::getrlimit(static_cast<__rlimit_resource>(r), &rl) != 0) continue;
    auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("inf") : std::to_string(v); };
    limits += (limits.empty() ? "" : ",") + std::to_string(r) + "=" + text(rl.rlim_cur) + ":" + text(rl.rlim_max);
  }
  f["rlimits"] = limits;
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, 0);
  if (errno == 0) f["nice"] = std::to_string(nice);
  return f;
}

class WarmStarter final : public RankStarter {
  struct Child {
    ExitCallback on_exit;
    int stderr_fd = -1;  // a copy, to say in the rank's log why it was lost, should the server die
    bool exited = false;
  };

 public:
  WarmStarter(int fd, int server_pid) : fd_(fd), server_pid_(server_pid) {}
  ~WarmStarter() override {
    if (fd_ >= 0) ::close(fd_);
    for (auto& [pid, c] : children_)
      if (c.stderr_fd >= 0) ::close(c.stderr_fd);
  }

  int start(uv_loop_t* loop, const RankStartRequest& req, ExitCallback on_exit) override {
    if (dead_) throw std::runtime_error("the warm server (pid " + std::to_string(server_pid_) + ") is gone");
    if (!loop_) init(loop);
    const int fds[3] = {req.stdout_fd, req.stderr_fd, req.control_fd};
    const std::string rank = std::to_string(req.local_rank);
    try {
      send_frame(fd_, WarmKind::start,
                 {{"rank", rank}, {"argv", join(req.argv)}, {"env", join(req.env)},
                  {"cwd", req.cwd.empty() ? current_directory() : req.cwd}},
                 fds, 3);
      for (;;) {
        Frame f;
        if (!read_frame(fd_, decoder_, f)) throw std::runtime_error("the warm server closed the connection");
        const auto kind = static_cast<WarmKind>(f.kind);
        auto fields = decode_fields(f.payload);
        if (kind == WarmKind::started && fields["rank"] == rank) {
          const int pid = to_int(fields["pid"]);
          Child& c = children_[pid];
          c.on_exit = std::move(on_exit);
          c.stderr_fd = ::fcntl(req.stderr_fd, F_DUPFD_CLOEXEC, 3);
          // What came in the same read (a quick rank's EXITED right behind its STARTED) is
          // out of the socket already: the loop's poll would never see it again.
          bool more = false;
          while (auto next = decoder_.next()) pending_.push_back(std::move(*next)), more = true;
          if (more) uv_timer_start(&drain_, [](uv_timer_t* t) { static_cast<WarmStarter*>(t->data)->dispatch(); }, 0, 0);
          return pid;
        }
        if (kind == WarmKind::start_failed)
          throw std::runtime_error("the warm server could not start rank " + rank + ": " + fields["reason"]);
        pending_.push_back(std::move(f));  // an exit of an earlier rank: handled on the loop
        uv_timer_start(&drain_, [](uv_timer_t* t) { static_cast<WarmStarter*>(t->data)->dispatch(); }, 0, 0);
      }
    } catch (const WarmUnavailable& e) {
      throw std::runtime_error(e.what());
    } catch (const std::system_error& e) {
      throw std::runtime_error(std::string(e.what()) + " (warm server pid " + std::to_string(server_pid_) + ")");
    }
  }

  void close() override {
    if (!loop_) return;
    uv_close(reinterpret_cast<uv_handle_t*>(&poll_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&drain_), nullptr);
    // Closing our end tells the server we are done (it ends any rank of ours still there).
    ::close(fd_);
    fd_ = -1;
  }

 private:
  void init(uv_loop_t* loop) {
    loop_ = loop;
    uv_timer_init(loop, &drain_);
    drain_.data = this;
    uv_poll_init(loop, &poll_, fd_);
    poll_.data = this;
    uv_poll_start(&poll_, UV_READABLE, [](uv_poll_t* p, int status, int) {
      auto* self = static_cast<WarmStarter*>(p->data);
      self->on_readable(status);
    });
  }

  void on_readable(int status) {
    if (dead_) return;
    char buf[65536];
    ssize_t n = status < 0 ? -1 : ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n > 0) {
      try {
        decoder_.feed({buf, static_cast<std::size_t>(n)});
        while (auto f = decoder_.next()) pending_.push_back(std::move(*f));
      } catch (const FrameError&) {
        n = 0;  // garbage from the server: treat it as gone
      }
      dispatch();
      if (n > 0) return;
    }
    server_lost();
  }

  void dispatch() {
    while (!pending_.empty()) {
      Frame f = std::move(pending_.front());
      pending_.pop_front();
      if (static_cast<WarmKind>(f.kind) != WarmKind::exited) continue;
      auto fields = decode_fields(f.payload);
      finish(to_int(fields["pid"]), to_int(fields["status"]), to_int(fields["signal"]));
    }
  }

  void finish(int pid, int status, int sig) {
    auto it = children_.find(pid);
    if (it == children_.end() || it->second.exited) return;
    it->second.exited = true;
    if (it->second.stderr_fd >= 0) ::close(it->second.stderr_fd);
    it->second.stderr_fd = -1;
    it->second.on_exit(status, sig);
  }

  // The server died (or broke the protocol): its ranks died with it (PR_SET_PDEATHSIG), and
  // no exit status will ever come for them. Each one's log says why.
  void server_lost() {
    dead_ = true;
    uv_poll_stop(&poll_);
    const std::string why = "airhost: the warm server (pid " + std::to_string(server_pid_) +
                            ") that forked this rank died; the rank was lost with it\n";
    std::vector<int> pids;
    for (auto& [pid, c] : children_)
      if (!c.exited) pids.push_back(pid);
    for (int pid : pids) {
      ::kill(-pid, SIGKILL);
      if (children_[pid].stderr_fd >= 0) write_all(children_[pid].stderr_fd, why);
      finish(pid, 0, SIGKILL);
    }
  }

  int fd_;
  int server_pid_;
  uv_loop_t* loop_ = nullptr;
  uv_poll_t poll_{};
  uv_timer_t drain_{};
  FrameDecoder decoder_;
  std::deque<Frame> pending_;
  std::map<int, Child> children_;
  bool dead_ = false;
};

}  // namespace

std::string default_warm_socket() {
  // Not next to the runs root: AIRHOST_RUNS_DIR may be set per launch (a job's own log
  // folder), and the user's server must be found from every one of them.
  if (const char* dir = std::getenv("AIRHOST_STATE_DIR"); dir && *dir) return std::string(dir) + "/warm.sock";
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) return std::string(state) + "/airhost/warm.sock";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/state/airhost/warm.sock";
  return "/tmp/airhost-state-" + std::to_string(::getuid()) + "/warm.sock";
}

int warm_connect(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) < 0) throw WarmUnavailable("no warm server running (" + path + " does not exist)");
  if (!S_ISSOCK(st.st_mode)) throw WarmUnavailable(path + " is not a socket; not trusted");
  if (st.st_uid != ::getuid())
    throw WarmUnavailable(path + " belongs to uid " + std::to_string(st.st_uid) + ", not to you (uid " +
                          std::to_string(::getuid()) + "); never trusted");
  if (st.st_mode & 077) throw WarmUnavailable(path + " is accessible to other users; not trusted");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) throw WarmUnavailable("warm socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw WarmUnavailable(std::string("socket: ") + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    const int err = errno;
    ::close(fd);
    if (err == ECONNREFUSED) {
      // Nobody listens: its server is gone (a server only renames its socket into place once
      // it listens). The user's own socket goes, so that the next launches do not say so
      // again; unless another server put its own there meanwhile (another inode).
      struct stat again{};
      if (::lstat(path.c_str(), &again) == 0 && again.st_ino == st.st_ino && again.st_dev == st.st_dev &&
          ::unlink(path.c_str()) == 0)
        throw WarmUnavailable("removed the stale warm socket " + path +
                              " (its server is gone; airhost warm start starts another)");
      throw WarmUnavailable("stale warm socket " + path + " (no server listening)");
    }
    throw WarmUnavailable("cannot connect to " + path + ": " + std::strerror(err));
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != ::getuid()) {
    ::close(fd);
    throw WarmUnavailable("the warm server behind " + path + " runs as uid " + std::to_string(cred.uid) +
                          ", not as you; never trusted");
  }
  return fd;
}

WarmServerInfo warm_hello(int fd, const std::vector<std::string>& rank_env) {
  Fields hello;
  if (!rank_env.empty()) {  // a launch (not `warm status`): the server checks it can serve it
    hello = process_attributes();
    hello["env"] = join(rank_env);
  }
  FrameDecoder decoder;
  Frame f;
  try {
    send_frame(fd, WarmKind::hello, hello);
    if (!read_frame(fd, decoder, f)) throw WarmUnavailable("the warm server closed the connection");
  } catch (const std::system_error& e) {
    throw WarmUnavailable(std::string("the warm server did not answer: ") + e.what());
  } catch (const FrameError& e) {
    throw WarmUnavailable(std::string("the warm server sent garbage: ") + e.what());
  }
  auto fields = decode_fields(f.payload);
  if (static_cast<WarmKind>(f.kind) == WarmKind::refused) throw WarmUnavailable("warm server refused: " + fields["reason"]);
  if (static_cast<WarmKind>(f.kind) != WarmKind::ready) throw WarmUnavailable("unexpected answer from the warm server");
  WarmServerInfo info;
  info.pid = to_int(fields["pid"]);
  info.python = fields["python"];
  info.version = fields["version"];
  info.preload = fields["preload"];
  info.modules = fields["modules"];
  info.uptime = fields["uptime"];
  info.ranks = to_int(fields["ranks"]);
  return info;
}

int warm_stop(int fd) {
  FrameDecoder decoder;
  Frame f;
  send_frame(fd, WarmKind::stop, {});
  if (!read_frame(fd, decoder, f) || static_cast<WarmKind>(f.kind) != WarmKind::stopping) return 0;
  return to_int(decode_fields(f.payload)["pid"]);
}

std::unique_ptr<RankStarter> make_warm_starter(int fd, int server_pid) {
  return std::make_unique<WarmStarter>(fd, server_pid);
}

}  // namespace airhost::detail
