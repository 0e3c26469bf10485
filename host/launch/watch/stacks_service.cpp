#include "launch/watch/stacks_service.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <list>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>

#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {
namespace {

constexpr std::uint64_t kPollMs = 20;
constexpr std::size_t kMaxRequest = 256;
// One round of a sampling every this long, unless a round itself takes longer.
constexpr long kSampleIntervalMs = 100;
// What a client may ask to sample for.
constexpr long kMinSampleMs = 100, kMaxSampleMs = 3600 * 1000;

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string state_name(char c) {
  switch (c) {
    case 'R': return "R (running)";
    case 'S': return "S (sleeping)";
    case 'D': return "D (disk sleep)";
    case 'T': return "T (stopped)";
    case 't': return "t (tracing stop)";
    case 'Z': return "Z (zombie)";
    case 'X': return "X (dead)";
    case 'I': return "I (idle)";
    default: return std::string(1, c);
  }
}

std::string time_name(double t) { return local_time_text(t, "%Y%m%d-%H%M%S"); }

}  // namespace

StacksRequest parse_stacks_request(std::string_view line) {
  StacksRequest r;
  std::size_t at = 0;
  while (at < line.size()) {
    const auto start = line.find_first_not_of(" \t\r", at);
    if (start == std::string_view::npos) break;
    const auto end = std::min(line.find_first_of(" \t\r", start), line.size());
    const std::string_view word = line.substr(start, end - start);
    at = end;
    if (word == "stacks") r.stacks = true;
    else if (word == "json") r.json = true;
    else if (word == "all-threads") r.all_threads = true;
    else if (word.substr(0, 7) == "sample=") {
      // Digits only, at most 12 of them (over an hour is refused anyway): no sign, no
      // overflow; anything else asks for a sampling that is out of range.
      const std::string_view digits = word.substr(7);
      long ms = 0;
      bool ok = !digits.empty() && digits.size() <= 12;
      for (std::size_t i = 0; ok && i < digits.size(); ++i) {
        if (digits[i] < '0' || digits[i] > '9') ok = false;
        else ms = ms * 10 + (digits[i] - '0');
      }
      r.sample_ms = ok ? ms : -1;
    }
  }
  return r;
}

std::size_t socket_address(const std::string& dir, const std::string& name, sockaddr_un& addr, int& dir_fd) {
  addr = {};
  addr.sun_family = AF_UNIX;
  dir_fd = -1;
  std::string path = dir + "/" + name;
  if (path.size() >= sizeof addr.sun_path) {
    dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + dir);
    path = "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return offsetof(sockaddr_un, sun_path) + path.size() + 1;
}

std::string proc_state(int pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return "";
  return state_name(stat[close + 2]);
}

std::string proc_wchan(int pid) {
  std::string w = read_small_file("/proc/" + std::to_string(pid) + "/wchan");
  while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
  return w;
}

// utime + stime of /proc/PID/stat, in clock ticks; -1 when it cannot be read.
long long cpu_ticks(int pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  long long utime = -1, stime = -1;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::atoll(f.c_str());
    if (i == 15) stime = std::atoll(f.c_str());
  }
  return utime < 0 || stime < 0 ? -1 : utime + stime;
}

struct StacksService::Impl {
  Options opt;
  std::string stacks_dir;
  std::string socket_path;
  bool listening = false, closed = false;
  uv_pipe_t server{};
  uv_timer_t timer{};
  bool timer_ready = false;

  // The request under way.
  struct Target {
    Rank rank;
    std::optional<RankStacks> answer;
  };
  unsigned seq = 0;
  bool busy = false;
  std::uint64_t deadline = 0;
  std::vector<Target> targets;
  std::vector<Done> waiters;
  bool keep = false;  // a waiter of the request under way wants the snapshot written
  std::optional<std::vector<int>> asking;  // the request under way asks these ranks only
  // Node 0 of several: the other nodes' answers to the request under way, by node.
  std::map<int, std::vector<RankStacks>> remote;
  std::uint64_t remote_deadline = 0;
  // Requests that could not share the one under way (it asks fewer ranks): next.
  struct Queued {
    Done done;
    bool keep = true;
    std::optional<std::vector<int>> only;
  };
  std::vector<Queued> queued;

  // The sampling under way, if any.
  struct Sampling {
    bool active = false;
    StacksSampler sampler;
    SampleDone done;
    std::uint64_t started_ms = 0, end_ms = 0, round_started_ms = 0, interval_ms = 0;
    double started_at = 0;
    std::map<int, long long> ticks;  // pid → CPU ticks at the start
    // Other nodes' ranks (their answers carry CPU ticks): rank → ticks and time, first and last.
    std::map<int, std::pair<long long, double>> first_remote, last_remote;
    const void* owner = nullptr;     // the socket's client that asked, if one did
  } sampling;
  uv_timer_t sample_timer{};

  // A client of the socket, from its connection until its answer is written.
  struct Client {
    Impl* self = nullptr;
    uv_pipe_t pipe{};
    std::string request;
    std::string answer;
    uv_write_t write{};
    bool taken = false;     // its request line was read: what follows it is never parsed
    bool answered = false;  // its one answer is written (or being written): write is in use
    bool closing = false;
    bool sampling = false;  // waits for a sampling: its going away ends the sampling
  };
  std::list<std::unique_ptr<Client>> clients;

  explicit Impl(Options o) : opt(std::move(o)) {
    stacks_dir = opt.run_dir + "/stacks";
    socket_path = opt.run_dir + "/" + kHostSocketName;
  }

  std::string dump_path(int rank) const { return stacks_dir + "/rank-" + std::to_string(rank) + ".dump"; }

  std::string start() {
    uv_timer_init(opt.loop, &timer);
    timer.data = this;
    uv_timer_init(opt.loop, &sample_timer);
    sample_timer.data = this;
    timer_ready = true;
    try {
      make_dirs(stacks_dir);
    } catch (const std::exception& e) {
      return e.what();
    }
    return listen();
  }

  std::string listen() {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return std::string("socket: ") + std::strerror(errno);
    sockaddr_un addr;
    int dir_fd = -1;
    std::size_t len = 0;
    try {
      len = socket_address(opt.run_dir, kHostSocketName, addr, dir_fd);
    } catch (const std::exception& e) {
      ::close(fd);
      return e.what();
    }
    ::unlink(socket_path.c_str());  // one left by an earlier attempt of this run
    const mode_t old = ::umask(0177);
    const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), static_cast<socklen_t>(len));
    const int err = errno;
    ::umask(old);
    if (dir_fd >= 0) ::close(dir_fd);
    if (rc < 0) {
      ::close(fd);
      return "cannot listen on " + socket_path + ": " + std::strerror(err);
    }
    uv_pipe_init(opt.loop, &server, 0);
    server.data = this;
    if (uv_pipe_open(&server, fd) < 0) {
      ::close(fd);
      uv_close(as_handle(&server), nullptr);
      return "cannot watch " + socket_path;
    }
    listening = true;
    if (int r = uv_listen(reinterpret_cast<uv_stream_t*>(&server), 8, [](uv_stream_t* s, int status) {
          if (status >= 0) static_cast<Impl*>(s->data)->accept();
        });
        r < 0)
      return "cannot listen on " + socket_path + ": " + uv_strerror(r);
    return "";
  }

  void accept() {
    auto c = std::make_unique<Client>();
    c->self = this;
    uv_pipe_init(opt.loop, &c->pipe, 0);
    c->pipe.data = c.get();
    Client* raw = c.get();
    clients.push_back(std::move(c));
    if (uv_accept(reinterpret_cast<uv_stream_t*>(&server), reinterpret_cast<uv_stream_t*>(&raw->pipe)) < 0)
      return finish_client(raw);
    uv_os_fd_t fd;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (uv_fileno(as_handle(&raw->pipe), &fd) < 0 || ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
        cred.uid != ::geteuid())
      return finish_client(raw);  // another user's process: not a word
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(&raw->pipe),
        [](uv_handle_t*, size_t, uv_buf_t* buf) {
          static char bytes[kMaxRequest];
          *buf = uv_buf_init(bytes, sizeof bytes);
        },
        [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
          auto* cl = static_cast<Client*>(s->data);
          cl->self->on_client_read(cl, n, buf);
        });
  }

  void on_client_read(Client* c, ssize_t n, const uv_buf_t* buf) {
    if (c->sampling) {
      // Still read while it samples, only to see the client go (Ctrl-C on `airhost stacks
      // --sample`): the sampling then ends with it, so that the next one is not refused.
      if (n >= 0) return;
      if (sampling.active && sampling.owner == c) stop_sampling();
      return finish_client(c);
    }
    if (n < 0) {
      // A client that shut its writing half after its request still gets the answer.
      if (n == UV_EOF && c->taken) return (void)uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->pipe));
      return finish_client(c);
    }
    // One request a connection: bytes after its line are read and dropped, never taken for
    // another request (they were, each read answering again while the first answer's write
    // was in flight: SIGSEGV), nor left unread (closing on unread bytes resets the client,
    // which may then never see its answer).
    if (c->taken) return;
    c->request.append(buf->base, static_cast<std::size_t>(n));
    const auto nl = c->request.find('\n');
    if (nl == std::string::npos) {
      if (c->request.size() > kMaxRequest) finish_client(c);
      return;
    }
    c->taken = true;
    const StacksRequest req = parse_stacks_request(std::string_view(c->request).substr(0, nl));
    const bool json = req.json, all = req.all_threads, stacks = req.stacks;
    const long sample_ms = req.sample_ms;
    if (!stacks) return reply(c, "error: unknown request\n");
    if (sample_ms) {
      if (sample_ms < kMinSampleMs || sample_ms > kMaxSampleMs) return reply(c, "error: a sampling lasts 100 ms to 1 h\n");
      const std::string why = sample(std::chrono::milliseconds(sample_ms), std::chrono::milliseconds(kSampleIntervalMs),
                                     [this, c, json](const StacksSample& s) {
                                       reply(c, json ? render_sample_json(s) : render_sample_text(s));
                                     });
      if (!why.empty()) return reply(c, "error: " + why + "\n");
      c->sampling = true;
      sampling.owner = c;
      return;
    }
    collect([this, c, json, all](const StacksSnapshot& s) { reply(c, json ? render_json(s) : render_text(s, all)); }, true);
  }

  void reply(Client* c, std::string text) {
    if (c->closing || c->answered) return;
    c->answered = true;
    if (c->sampling) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->pipe));
    c->answer = std::move(text);
    uv_buf_t b = uv_buf_init(c->answer.data(), static_cast<unsigned>(c->answer.size()));
    c->write.data = c;
    if (uv_write(&c->write, reinterpret_cast<uv_stream_t*>(&c->pipe), &b, 1, [](uv_write_t* w, int) {
          auto* cl = static_cast<Client*>(w->data);
          cl->self->finish_client(cl);
        }) < 0)
      finish_client(c);
  }

  void finish_client(Client* c) {
    if (c->closing) return;
    c->closing = true;
    uv_close(as_handle(&c->pipe), [](uv_handle_t* h) {
      auto* cl = static_cast<Client*>(h->data);
      auto& list = cl->self->clients;
      for (auto it = list.begin(); it != list.end(); ++it)
        if (it->get() == cl) {
          list.erase(it);
          break;
        }
    });
  }

  // ---- collecting ----------------------------------------------------------------------

  // Whether a request asking `only` (every rank when null) can share the one under way.
  bool shares_round(const std::vector<int>* only) const {
    if (!asking) return true;
    if (!only) return false;
    for (int r : *only)
      if (std::find(asking->begin(), asking->end(), r) == asking->end()) return false;
    return true;
  }

  void collect(Done done, bool keep_it = true, const std::vector<int>* only = nullptr) {
    if (closed) return;
    if (busy && !shares_round(only)) {
      queued.push_back({std::move(done), keep_it, only ? std::optional<std::vector<int>>(*only) : std::nullopt});
      return;
    }
    waiters.push_back(std::move(done));
    if (busy) {
      keep = keep || keep_it;
      return;
    }
    keep = keep_it;
    busy = true;
    asking = only ? std::optional<std::vector<int>>(*only) : std::nullopt;
    ++seq;
    targets.clear();
    for (const Rank& r : opt.ranks()) {
      Target t{r, std::nullopt};
      if (!r.alive) {
        t.answer = RankStacks{};
        t.answer->status = "exited";
      } else if (only && std::find(only->begin(), only->end(), r.rank) == only->end()) {
        t.answer = RankStacks{};
        t.answer->status = "not asked";
      } else if (r.request_fd < 0) {
        t.answer = RankStacks{};
        t.answer->status = "no answer: it is not ready for the request yet (starting)";
        t.answer->proc_state = proc_state(r.pid);
        t.answer->wchan = proc_wchan(r.pid);
      } else {
        const unsigned char number[4] = {static_cast<unsigned char>(seq), static_cast<unsigned char>(seq >> 8),
                                         static_cast<unsigned char>(seq >> 16), static_cast<unsigned char>(seq >> 24)};
        // Never blocks: a rank that stopped reading (stuck, stopped) has a full buffer, and is
        // named when the wait is over, as one that does not answer.
        if (::send(r.request_fd, number, sizeof number, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
            errno != EWOULDBLOCK && errno != EINTR) {
          t.answer = RankStacks{};
          t.answer->status = "exited";
        }
      }
      if (t.answer) t.answer->pid = r.pid;
      targets.push_back(std::move(t));
    }
    deadline = uv_now(opt.loop) + static_cast<std::uint64_t>(opt.wait.count());
    remote.clear();
    if (asks_nodes()) {
      remote_deadline = deadline + static_cast<std::uint64_t>(kRemoteSlackMs);
      opt.ask_nodes(seq, only);
    }
    uv_timer_start(&timer, [](uv_timer_t* t) { static_cast<Impl*>(t->data)->poll(); }, 0, kPollMs);
  }

  // Node 0 of several: every request also asks the other nodes.
  bool asks_nodes() const { return opt.ask_nodes && opt.nnodes > 1; }

  void take_answer(int node, unsigned answer_seq, std::vector<RankStacks> ranks) {
    if (!busy || !asks_nodes() || answer_seq != seq || node <= 0 || node >= opt.nnodes) return;
    for (auto& r : ranks) r.node = node;
    remote[node] = std::move(ranks);
    poll();
  }

  void poll() {
    if (!busy) return;
    bool all = true;
    for (auto& t : targets) {
      if (t.answer) continue;
      if (auto a = parse_dump(read_small_file(dump_path(t.rank.rank)), seq)) t.answer = std::move(a);
      else all = false;
    }
    const std::uint64_t now = uv_now(opt.loop);
    if (!all && now < deadline) return;
    if (asks_nodes() && remote.size() + 1 < static_cast<std::size_t>(opt.nnodes) && now < remote_deadline) return;
    uv_timer_stop(&timer);
    StacksSnapshot snap;
    snap.run_id = opt.run_id;
    snap.taken_at = now_seconds();
    const double secs = static_cast<double>(opt.wait.count()) / 1000.0;
    char wait_text[32];
    std::snprintf(wait_text, sizeof wait_text, "%g", secs);
    for (auto& t : targets) {
      RankStacks r = t.answer ? std::move(*t.answer) : RankStacks{};
      if (!t.answer) {
        r.status = std::string("no answer within ") + wait_text + " s";
        r.proc_state = proc_state(t.rank.pid);
        r.wchan = proc_wchan(t.rank.pid);
      }
      r.rank = t.rank.rank;
      r.local_rank = t.rank.local_rank;
      r.node = opt.node;
      r.pid = t.rank.pid;
      snap.ranks.push_back(std::move(r));
    }
    if (asks_nodes()) add_remote(snap);
    if (keep) snap.file = write_snapshot(snap);
    busy = false;
    asking.reset();
    auto done = std::move(waiters);
    waiters.clear();
    for (auto& d : done) d(snap);
    // What waited for a round of its own.
    auto next = std::move(queued);
    queued.clear();
    for (auto& q : next) collect(std::move(q.done), q.keep, q.only ? &*q.only : nullptr);
  }

  // The other nodes' ranks: as each node answered, or, for a node that did not, each of its
  // ranks named so.
  void add_remote(StacksSnapshot& snap) {
    char wait_text[32];
    std::snprintf(wait_text, sizeof wait_text, "%g", static_cast<double>(opt.wait.count() + kRemoteSlackMs) / 1000.0);
    for (int n = 1; n < opt.nnodes; ++n) {
      if (auto it = remote.find(n); it != remote.end()) {
        for (auto& r : it->second) snap.ranks.push_back(std::move(r));
        continue;
      }
      for (int i = 0; i < opt.nprocs; ++i) {
        RankStacks r;
        r.rank = n * opt.nprocs + i;
        r.local_rank = i;
        r.node = n;
        const bool asked = !asking || std::find(asking->begin(), asking->end(), r.rank) != asking->end();
        r.status = asked ? "no answer: node " + std::to_string(n) + " did not answer within " + wait_text + " s"
                         : "not asked";
        snap.ranks.push_back(std::move(r));
      }
    }
    std::stable_sort(snap.ranks.begin(), snap.ranks.end(), [](const RankStacks& a, const RankStacks& b) { return a.rank < b.rank; });
    remote.clear();
  }

  // ---- sampling ------------------------------------------------------------------------

  std::string sample(std::chrono::milliseconds length, std::chrono::milliseconds interval, SampleDone done) {
    if (closed) return "the run is ending";
    if (sampling.active) return "a sampling of this run is under way; ask again when it ends";
    sampling = Sampling{};
    sampling.active = true;
    sampling.done = std::move(done);
    sampling.started_at = now_seconds();
    sampling.started_ms = uv_now(opt.loop);
    sampling.end_ms = sampling.started_ms + static_cast<std::uint64_t>(length.count());
    sampling.interval_ms = static_cast<std::uint64_t>(interval.count());
    for (const Rank& r : opt.ranks())
      if (r.alive) sampling.ticks[r.pid] = cpu_ticks(r.pid);
    sample_round();
    return "";
  }

  void sample_round() {
    sampling.round_started_ms = uv_now(opt.loop);
    collect([this](const StacksSnapshot& snap) { on_sample_round(snap); }, false);
  }

  void on_sample_round(const StacksSnapshot& snap) {
    if (!sampling.active) return;
    sampling.sampler.add(snap);
    for (const auto& r : snap.ranks)
      if (r.node != opt.node && r.cpu_ticks >= 0) {
        sampling.first_remote.emplace(r.rank, std::make_pair(r.cpu_ticks, snap.taken_at));
        sampling.last_remote[r.rank] = {r.cpu_ticks, snap.taken_at};
      }
    uv_update_time(opt.loop);
    const std::uint64_t now = uv_now(opt.loop);
    if (now >= sampling.end_ms) return finish_sampling();
    const std::uint64_t next = sampling.round_started_ms + sampling.interval_ms;
    uv_timer_start(&sample_timer, [](uv_timer_t* t) { static_cast<Impl*>(t->data)->sample_round(); },
                   next > now ? std::min(next - now, sampling.end_ms - now) : 0, 0);
  }

  void stop_sampling() {
    uv_timer_stop(&sample_timer);
    sampling = Sampling{};
  }

  void finish_sampling() {
    StacksSample s = sampling.sampler.result();
    s.run_id = opt.run_id;
    s.started_at = sampling.started_at;
    s.seconds = static_cast<double>(uv_now(opt.loop) - sampling.started_ms) / 1000.0;
    s.interval_ms = static_cast<long>(sampling.interval_ms);
    const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
    for (auto& r : s.ranks) {
      if (r.node != opt.node) {
        const auto a = sampling.first_remote.find(r.rank), b = sampling.last_remote.find(r.rank);
        if (a != sampling.first_remote.end() && b != sampling.last_remote.end() && hz > 0 &&
            b->second.second > a->second.second && b->second.first >= a->second.first)
          r.cpu_percent = 100.0 * static_cast<double>(b->second.first - a->second.first) / hz /
                          (b->second.second - a->second.second);
        continue;
      }
      const auto it = sampling.ticks.find(r.pid);
      if (it == sampling.ticks.end() || it->second < 0 || s.seconds <= 0 || hz <= 0) continue;
      const long long now_ticks = cpu_ticks(r.pid);
      if (now_ticks >= it->second) r.cpu_percent = 100.0 * static_cast<double>(now_ticks - it->second) / hz / s.seconds;
    }
    std::string path = stacks_dir + "/sample-" + time_name(s.started_at) + ".txt";
    for (int k = 2; ::access(path.c_str(), F_OK) == 0; ++k)
      path = stacks_dir + "/sample-" + time_name(s.started_at) + "-" + std::to_string(k) + ".txt";
    s.file = path;
    try {
      write_file_atomic(path, render_sample_text(s));
    } catch (const std::exception&) {
      s.file.clear();
    }
    auto done = std::move(sampling.done);
    sampling = Sampling{};
    if (done) done(s);
  }

  std::string write_snapshot(StacksSnapshot& snap) {
    std::string path = stacks_dir + "/" + time_name(snap.taken_at) + ".txt";
    for (int k = 2; ::access(path.c_str(), F_OK) == 0; ++k)
      path = stacks_dir + "/" + time_name(snap.taken_at) + "-" + std::to_string(k) + ".txt";
    snap.file = path;  // named in its own summary
    try {
      write_file_atomic(path, render_full(snap));
      return path;
    } catch (const std::exception&) {
      return "";
    }
  }

  void close() {
    if (closed) return;
    closed = true;
    waiters.clear();
    queued.clear();
    sampling = Sampling{};
    if (timer_ready) {
      uv_close(as_handle(&timer), nullptr);
      uv_close(as_handle(&sample_timer), nullptr);
    }
    if (listening) {
      uv_close(as_handle(&server), nullptr);
      ::unlink(socket_path.c_str());
    }
    for (auto& c : clients)
      if (!c->closing) finish_client(c.get());
  }
};

StacksService::StacksService(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
StacksService::~StacksService() = default;
std::string StacksService::start() { return impl_->start(); }
void StacksService::collect(Done done, bool keep, const std::vector<int>* only) {
  impl_->collect(std::move(done), keep, only);
}
std::string StacksService::sample(std::chrono::milliseconds length, std::chrono::milliseconds interval, SampleDone done) {
  return impl_->sample(length, interval, std::move(done));
}
void StacksService::take_answer(int node, unsigned seq, std::vector<RankStacks> ranks) {
  impl_->take_answer(node, seq, std::move(ranks));
}
void StacksService::close() { impl_->close(); }

}  // namespace airhost::detail
