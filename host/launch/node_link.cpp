// node_link.cpp — see node_link.hpp for the protocol.
#include "launch/node_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "airhost/launcher.hpp"
#include "launch/frames.hpp"

namespace airhost::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// No link frame is anywhere near this: a larger length means the peer is not an airhost.
constexpr std::size_t kMaxLinkFrame = 64 * 1024;
// An accepted connection must say hello within this, or it is dropped (a port scanner, a
// stray client of a previous run's store).
constexpr auto kHelloWait = std::chrono::seconds(10);

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown";
  return buf;
}

std::string seconds_text(milliseconds ms) {
  char buf[32];
  if (ms.count() % 1000 == 0) std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(ms.count() / 1000));
  else std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms.count()) / 1000);
  return buf;
}

int to_int(const std::string& s, int fallback) {
  try {
    return std::stoi(s);
  } catch (...) {
    return fallback;
  }
}

std::string frame(LinkKind kind, const Fields& fields = {}) {
  return encode_frame(static_cast<std::uint16_t>(kind), encode_fields(fields));
}

// One complete frame off the front of `in`, if there is one. Throws FrameError on bytes
// that are not link frames.
std::optional<Frame> pop_frame(std::string& in) {
  if (in.size() < kFrameHeaderSize) return std::nullopt;
  auto le = [&](std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
    return v;
  };
  if (le(0, 4) != kFrameMagic) throw FrameError("not an airhost node link frame");
  const std::uint64_t length = le(8, 8);
  if (length > kMaxLinkFrame) throw FrameError("node link frame too long");
  if (in.size() < kFrameHeaderSize + length) return std::nullopt;
  Frame f;
  f.kind = static_cast<std::uint16_t>(le(4, 2));
  f.payload = in.substr(kFrameHeaderSize, length);
  in.erase(0, kFrameHeaderSize + length);
  return f;
}

void set_socket_options(int fd) {
  int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Sends all of `data` on a non-blocking socket, waiting up to a second for room: link frames
// are tiny, so a socket with no room for one belongs to a node that stopped reading.
bool send_all(int fd, std::string_view data) {
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && Clock::now() < deadline) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    return false;
  }
  return true;
}

// Reads what is there. 1: data or nothing yet; 0: the other end closed; -1: an error.
int read_into(int fd, std::string& in) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      in.append(buf, static_cast<std::size_t>(n));
      if (in.size() > 4 * kMaxLinkFrame) return -1;
      continue;
    }
    if (n == 0) return 0;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -1;
  }
}

std::string peer_address(const sockaddr_storage& sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(sa).sin_addr, buf, sizeof buf);
  else if (sa.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(sa).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) ::inet_ntop(AF_INET, &a6.s6_addr[12], buf, sizeof buf);
    else ::inet_ntop(AF_INET6, &a6, buf, sizeof buf);
  }
  return buf[0] ? buf : "?";
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Closes a connection without losing what was sent on it: unread input would turn the close
// into a reset, which can make the other end drop our last frames unread.
void close_gently(int& fd) {
  if (fd < 0) return;
  ::shutdown(fd, SHUT_WR);
  std::string sink;
  read_into(fd, sink);
  close_fd(fd);
}

void say(const NodeLinkConfig& cfg, const std::string& line) {
  if (cfg.say) std::fprintf(stderr, "airhost: node %d of %d: %s\n", cfg.node_rank, cfg.nnodes, line.c_str());
}

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

}  // namespace

// ---- codec and checks ---------------------------------------------------------------------

std::string encode_hello(const NodeHello& h) {
  return encode_fields({{"version", std::to_string(h.version)},
                        {"node_rank", std::to_string(h.node_rank)},
                        {"nnodes", std::to_string(h.nnodes)},
                        {"nprocs", std::to_string(h.nprocs)},
                        {"host", h.host}});
}

NodeHello decode_hello(std::string_view payload) {
  auto f = decode_fields(payload);
  if (!f.count("version") || !f.count("node_rank"))
    throw FrameError("a node link hello needs at least a version and a node rank");
  NodeHello h;
  h.version = to_int(f["version"], -1);
  h.node_rank = to_int(f["node_rank"], -1);
  h.nnodes = to_int(f["nnodes"], -1);
  h.nprocs = to_int(f["nprocs"], -1);
  h.host = f["host"].empty() ? "unknown" : f["host"];
  return h;
}

std::string describe_node(const NodeHello& n) {
  std::string s = "node " + std::to_string(n.node_rank) + " (" + n.host;
  if (!n.address.empty() && n.address != n.host) s += ", " + n.address;
  return s + ")";
}

std::string check_nodes(const NodeHello& self, const std::vector<NodeHello>& peers) {
  auto named = [](const NodeHello& n) {  // a node whose rank may be the problem
    return n.host + (n.address.empty() || n.address == n.host ? "" : " (" + n.address + ")");
  };
  for (const auto& p : peers)
    if (p.version != self.version)
      return "the node on " + named(p) + " speaks node link protocol " + std::to_string(p.version) + ", " +
             describe_node(self) + " speaks " + std::to_string(self.version) +
             "; install the same airhost version on every node";
  for (const auto& p : peers)
    if (p.nnodes != self.nnodes)
      return "the nodes disagree on the number of nodes: " + describe_node(self) + " was given --nnodes " +
             std::to_string(self.nnodes) + ", the node on " + named(p) + " --nnodes " + std::to_string(p.nnodes) +
             "; give every node the same --nnodes";
  for (const auto& p : peers) {
    if (p.node_rank == 0)
      return "two nodes were given --node-rank 0: " + named(self) + " and " + named(p) +
             "; node 0 is the one at --master-addr, give the others 1.." + std::to_string(self.nnodes - 1);
    if (p.node_rank < 0 || p.node_rank >= self.nnodes)
      return "the node on " + named(p) + " was given --node-rank " + std::to_string(p.node_rank) + ", but the job has " +
             std::to_string(self.nnodes) + " nodes (node ranks 0.." + std::to_string(self.nnodes - 1) + ")";
  }
  for (std::size_t i = 0; i < peers.size(); ++i)
    for (std::size_t j = i + 1; j < peers.size(); ++j)
      if (peers[i].node_rank == peers[j].node_rank)
        return "two nodes were given --node-rank " + std::to_string(peers[i].node_rank) + ": " + named(peers[i]) +
               " and " + named(peers[j]) + "; give each node its own --node-rank";
  for (const auto& p : peers)
    if (p.nprocs != self.nprocs)
      return "the nodes disagree on the ranks per node: " + describe_node(self) + " runs " +
             std::to_string(self.nprocs) + ", " + describe_node(p) + " runs " + std::to_string(p.nprocs) +
             "; every node must run the same number (-n/--accelerators), since WORLD_SIZE = nnodes x ranks per node";
  return {};
}

std::string resolve_problem(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  if (rc == 0 || rc == EAI_AGAIN) return {};
  return rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
}

// ---- the link ------------------------------------------------------------------------------

struct NodeLink::Impl {
  struct Conn {
    int fd = -1;
    NodeHello node;           // who is at the other end
    std::string in;           // bytes not yet a whole frame
    Clock::time_point last_rx;
    bool said_down = false;   // it reported its own teardown: its close is expected
    bool done = false;        // its ranks all succeeded
    bool gone = false;        // lost: no longer read or timed, but still told why we stop
  };

  NodeLinkConfig cfg;
  milliseconds heartbeat{1000};
  std::vector<NodeHello> nodes;
  std::vector<Conn> conns;  // node 0: one per other node; another node: one, to node 0
  int wake[2] = {-1, -1};
  std::thread thread;
  std::function<void(const NodeDown&)> on_down;

  mutable std::mutex m;  // guards what follows
  std::condition_variable cv;
  std::vector<std::string> outbox;  // frames for every connection
  bool stop = false;
  bool finishing = false;  // this node's ranks succeeded (node 0: it counts itself done)
  bool ended = false;      // every node finished
  std::set<int> heard;     // nodes reported down
  std::optional<NodeDown> first_down, first_real;
  bool all_quiet = false;  // every connection closed or reported its teardown

  bool hub() const { return cfg.node_rank == 0; }

  ~Impl() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    poke();
    if (thread.joinable()) thread.join();
    for (auto& c : conns) close_gently(c.fd);
    close_fd(wake[0]);
    close_fd(wake[1]);
  }

  void poke() {
    if (wake[1] >= 0) {
      const char b = 1;
      [[maybe_unused]] auto n = ::write(wake[1], &b, 1);
    }
  }

  void queue(std::string f) {
    {
      std::lock_guard lock(m);
      outbox.push_back(std::move(f));
    }
    poke();
  }

  // ---- on the link's thread

  void record(NodeDown d) {
    {
      std::lock_guard lock(m);
      if (heard.count(d.node)) return;
      heard.insert(d.node);
      if (!first_down) first_down = d;
      if (!d.cascade && !first_real) first_real = d;
    }
    cv.notify_all();
    if (on_down) on_down(d);
  }

  // Node 0 passes what it heard from or about one node to the others.
  void relay(const NodeDown& d, const Conn* from) {
    if (!hub()) return;
    const std::string f =
        frame(LinkKind::down, {{"node", std::to_string(d.node)}, {"message", d.message}, {"cascade", d.cascade ? "1" : "0"}});
    for (auto& c : conns)
      if (&c != from && c.fd >= 0) send_all(c.fd, f);
  }

  // A node that went silent or sent garbage keeps its connection, so that it still hears
  // why this node stops should it be merely frozen; one that closed it has none left.
  void lost(Conn& c, const std::string& why, bool closed) {
    NodeDown d{c.node.node_rank, describe_node(c.node) + " was lost: " + why, false};
    c.gone = true;
    if (closed) close_fd(c.fd);
    relay(d, &c);
    record(d);
  }

  void update_quiet() {
    bool quiet = true;
    for (auto& c : conns) quiet &= c.fd < 0 || c.gone || c.said_down;
    {
      std::lock_guard lock(m);
      all_quiet = quiet;
    }
    cv.notify_all();
  }

  // Node 0: when it and every other node are done, it tells them all to end.
  void check_all_done() {
    if (!hub()) return;
    {
      std::lock_guard lock(m);
      if (!finishing || ended) return;
    }
    for (auto& c : conns)
      if (!c.done) return;
    for (auto& c : conns)
      if (c.fd >= 0) send_all(c.fd, frame(LinkKind::end));
    {
      std::lock_guard lock(m);
      ended = true;
    }
    cv.notify_all();
  }

  void on_frame(Conn& c, const Frame& f) {
    switch (static_cast<LinkKind>(f.kind)) {
      case LinkKind::down: {
        auto fields = decode_fields(f.payload);
        NodeDown d{to_int(fields["node"], -1), fields["message"], fields["cascade"] == "1"};
        if (d.node == c.node.node_rank) c.said_down = true;
        relay(d, &c);
        record(d);
        break;
      }
      case LinkKind::done:
        c.done = true;
        check_all_done();
        break;
      case LinkKind::end: {
        std::lock_guard lock(m);
        ended = true;
        break;
      }
      default:
        break;  // heartbeats, and kinds of a later version
    }
    cv.notify_all();
  }

  void on_closed(Conn& c) {
    bool expected = c.said_down || c.done;
    {
      std::lock_guard lock(m);
      expected |= ended;
    }
    if (expected) {
      close_fd(c.fd);
      check_all_done();
      return;
    }
    lost(c, "its connection closed (its airhost exited or was killed)", true);
  }

  void loop() {
    auto next_beat = Clock::now();
    std::vector<pollfd> fds;
    for (;;) {
      std::vector<std::string> out;
      bool stopping;
      {
        std::lock_guard lock(m);
        out.swap(outbox);
        stopping = stop;
      }
      for (const auto& f : out)
        for (auto& c : conns)
          if (c.fd >= 0) send_all(c.fd, f);
      if (stopping) return;
      check_all_done();

      const auto now = Clock::now();
      if (now >= next_beat) {
        const std::string beat = frame(LinkKind::heartbeat);
        for (auto& c : conns)
          if (c.fd >= 0 && !c.gone) send_all(c.fd, beat);
        next_beat = now + heartbeat;
      }
      for (auto& c : conns)
        if (c.fd >= 0 && !c.gone && now - c.last_rx > cfg.node_timeout)
          lost(c, "nothing heard from it for " + seconds_text(cfg.node_timeout) + " (node_timeout)", false);
      update_quiet();

      fds.assign(1, pollfd{wake[0], POLLIN, 0});
      for (auto& c : conns) fds.push_back(pollfd{c.gone ? -1 : c.fd, POLLIN, 0});  // poll skips -1
      const auto wait = std::chrono::duration_cast<milliseconds>(next_beat - Clock::now()).count();
      ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait, 1, 1000)));
      if (fds[0].revents) {
        char buf[64];
        while (::read(wake[0], buf, sizeof buf) > 0) {
        }
      }
      for (std::size_t i = 0; i < conns.size(); ++i) {
        Conn& c = conns[i];
        if (fds[i + 1].fd < 0 || !fds[i + 1].revents) continue;
        const int rc = read_into(c.fd, c.in);
        if (!c.in.empty()) c.last_rx = Clock::now();
        try {
          while (auto f = pop_frame(c.in)) on_frame(c, *f);
        } catch (const FrameError& e) {
          lost(c, std::string("it sent garbage (") + e.what() + ")", false);
          continue;
        }
        if (rc <= 0) on_closed(c);
      }
    }
  }
};

NodeLink::NodeLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeLink::~NodeLink() = default;

const std::vector<NodeHello>& NodeLink::nodes() const { return impl_->nodes; }

void NodeLink::start(std::function<void(const NodeDown&)> on_down) {
  Impl& s = *impl_;
  s.on_down = std::move(on_down);
  if (::pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) < 0)
    throw std::system_error(errno, std::generic_category(), "pipe");
  for (auto& c : s.conns) c.last_rx = Clock::now();
  s.thread = std::thread([&s] { s.loop(); });
}

void NodeLink::tell_down(const std::string& why, bool cascade) {
  Impl& s = *impl_;
  const std::string message = describe_node(s.nodes[static_cast<std::size_t>(s.cfg.node_rank)]) + " " + why;
  s.queue(frame(LinkKind::down, {{"node", std::to_string(s.cfg.node_rank)},
                                 {"message", message},
                                 {"cascade", cascade ? "1" : "0"}}));
}

std::optional<NodeDown> NodeLink::down() const {
  std::lock_guard lock(impl_->m);
  return impl_->first_real ? impl_->first_real : impl_->first_down;
}

std::optional<NodeDown> NodeLink::wait_down(milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lock(s.m);
  s.cv.wait_for(lock, limit, [&] { return s.first_real || s.all_quiet; });
  return s.first_real ? s.first_real : s.first_down;
}

std::optional<NodeDown> NodeLink::finish(milliseconds limit) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.m);
    s.finishing = true;
  }
  if (!s.hub()) s.queue(frame(LinkKind::done));
  else s.poke();
  std::unique_lock lock(s.m);
  auto ready = [&] { return s.ended || s.first_down.has_value(); };
  if (limit.count() > 0) s.cv.wait_for(lock, limit, ready);
  else s.cv.wait(lock, ready);
  if (s.first_down) return s.first_real ? s.first_real : s.first_down;
  if (s.ended) return std::nullopt;
  return NodeDown{-1, "the other nodes did not finish within the run's timeout", false};
}

// ---- the join ------------------------------------------------------------------------------

namespace {

struct Pending {
  int fd = -1;
  std::string address;
  std::string in;
  Clock::time_point since;
};

[[noreturn]] void refuse_all(std::vector<NodeLink::Impl::Conn>& joined, const std::string& message, bool join_error) {
  const std::string f = frame(LinkKind::refuse, {{"message", message}, {"kind", join_error ? "join" : "usage"}});
  for (auto& c : joined) {
    send_all(c.fd, f);
    close_gently(c.fd);
  }
  if (join_error) throw NodeJoinError(message);
  throw LaunchError(message);
}

// The nodes disagree: before node 0 gives up, the nodes still on their way (up to `missing`
// of them, for a few seconds) get the same refusal, so that they too exit 2 at once instead
// of waiting out the join timeout for a node 0 that has gone.
void refuse_late_joiners(int l4, int l6, std::vector<Pending>& pending, const std::string& message, int missing) {
  const std::string f = frame(LinkKind::refuse, {{"message", message}, {"kind", "usage"}});
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (missing > 0 && Clock::now() < until) {
    std::vector<pollfd> fds = {{l4, POLLIN, 0}, {l6, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    for (int l : {l4, l6}) {
      if (l < 0) continue;
      for (;;) {
        sockaddr_storage sa{};
        socklen_t len = sizeof sa;
        const int fd = ::accept4(l, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        pending.push_back({fd, peer_address(sa), {}, Clock::now()});
      }
    }
    for (std::size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      const int rc = read_into(p.fd, p.in);
      bool answered = false;
      try {
        if (auto hello = pop_frame(p.in); hello && hello->kind == static_cast<std::uint16_t>(LinkKind::hello)) {
          send_all(p.fd, f);
          answered = true;
          --missing;
        }
      } catch (const FrameError&) {
        answered = true;  // not a node: just close it
      }
      if (answered || rc <= 0) {
        close_gently(p.fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
  }
}

int listen_on(int family, int port, std::string& error) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int rc;
  if (family == AF_INET) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc < 0 || ::listen(fd, 64) < 0) {
    error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

std::unique_ptr<NodeLink::Impl> join_as_hub(const NodeLinkConfig& cfg, const NodeHello& self,
                                            const std::function<bool()>& cancelled) {
  std::string error;
  int l4 = listen_on(AF_INET, cfg.master_port, error);
  if (l4 < 0)
    throw LaunchError("node 0 cannot listen on port " + std::to_string(cfg.master_port) + ": " + error +
                      "; pick another --master-port and give it to every node");
  std::string ignored;
  int l6 = listen_on(AF_INET6, cfg.master_port, ignored);  // no IPv6 here: IPv4 alone
  struct Listeners {
    int& a;
    int& b;
    ~Listeners() {
      close_fd(a);
      close_fd(b);
    }
  } listeners{l4, l6};

  std::vector<Pending> pending;
  struct PendingGuard {
    std::vector<Pending>& list;
    ~PendingGuard() {
      for (auto& p : list) close_fd(p.fd);  // strangers, late or refused with the rest
    }
  } pending_guard{pending};
  std::vector<NodeLink::Impl::Conn> joined;
  const auto deadline = Clock::now() + cfg.join_timeout;
  say(cfg, "waiting on port " + std::to_string(cfg.master_port) + " for " + std::to_string(cfg.nnodes - 1) +
               " other node(s) to join");
  while (static_cast<int>(joined.size()) < cfg.nnodes - 1) {
    if (cancelled && cancelled()) refuse_all(joined, "node 0 was stopped while the nodes joined", true);
    const auto now = Clock::now();
    if (now >= deadline) {
      std::set<int> here;
      for (auto& c : joined) here.insert(c.node.node_rank);
      std::vector<std::string> missing;
      for (int r = 1; r < cfg.nnodes; ++r)
        if (!here.count(r)) missing.push_back(std::to_string(r));
      refuse_all(joined,
                 "node" + std::string(missing.size() > 1 ? "s " : " ") + join_list(missing) + " did not join node 0 (" +
                     self.host + ", port " + std::to_string(cfg.master_port) + ") within " +
                     seconds_text(cfg.join_timeout) + " (join_timeout); start airhost with the same --nnodes, " +
                     "--master-addr and --master-port on every node, and check that they can reach this one",
                 true);
    }
    std::vector<pollfd> fds;
    for (int l : {l4, l6}) fds.push_back({l, POLLIN, 0});
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    for (auto& c : joined) fds.push_back({c.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);

    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      for (;;) {
        sockaddr_storage sa{};
        socklen_t len = sizeof sa;
        const int fd = ::accept4(fds[i].fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        set_socket_options(fd);
        pending.push_back({fd, peer_address(sa), {}, Clock::now()});
      }
    }
    // A node that joined and left again (killed, restarted) is waited for anew; looked at
    // first, so that its new hello is not taken for a second node of the same rank.
    for (std::size_t i = 0; i < joined.size();) {
      std::string sink;
      if (read_into(joined[i].fd, sink) <= 0) {
        say(cfg, describe_node(joined[i].node) + " left before every node joined; waiting for it again");
        close_fd(joined[i].fd);
        joined.erase(joined.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
    // Connections that have not said hello yet.
    for (std::size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      const int rc = read_into(p.fd, p.in);
      std::optional<Frame> f;
      bool garbage = false;
      try {
        f = pop_frame(p.in);
      } catch (const FrameError&) {
        garbage = true;
      }
      if (f && f->kind == static_cast<std::uint16_t>(LinkKind::hello)) {
        NodeHello h;
        try {
          h = decode_hello(f->payload);
        } catch (const FrameError&) {
          garbage = true;
        }
        if (!garbage) {
          h.address = p.address;
          NodeLink::Impl::Conn c;
          c.fd = p.fd;
          c.node = h;
          c.in = std::move(p.in);
          joined.push_back(std::move(c));
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          std::vector<NodeHello> peers;
          for (auto& j : joined) peers.push_back(j.node);
          if (auto problem = check_nodes(self, peers); !problem.empty()) {
            refuse_late_joiners(l4, l6, pending, problem, cfg.nnodes - 1 - static_cast<int>(joined.size()));
            refuse_all(joined, problem, false);
          }
          say(cfg, describe_node(h) + " joined");
          continue;
        }
      }
      if (garbage || (f && f->kind != static_cast<std::uint16_t>(LinkKind::hello))) {
        say(cfg, "ignored a connection from " + p.address + ": it does not speak airhost's node link");
        close_fd(p.fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (rc <= 0 || Clock::now() - p.since > kHelloWait) {
        close_fd(p.fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
  }
  auto impl = std::make_unique<NodeLink::Impl>();
  impl->cfg = cfg;
  impl->nodes.resize(static_cast<std::size_t>(cfg.nnodes));
  impl->nodes[0] = self;
  std::sort(joined.begin(), joined.end(), [](auto& a, auto& b) { return a.node.node_rank < b.node.node_rank; });
  std::vector<std::string> names;
  const std::string welcome = frame(LinkKind::welcome, {{"host", self.host}, {"nodes", std::to_string(cfg.nnodes)}});
  for (auto& c : joined) {
    impl->nodes[static_cast<std::size_t>(c.node.node_rank)] = c.node;
    names.push_back(describe_node(c.node));
    send_all(c.fd, welcome);
  }
  impl->conns = std::move(joined);
  say(cfg, "all " + std::to_string(cfg.nnodes) + " nodes joined (" + join_list(names) + "); starting the ranks");
  return impl;  // the listeners close here: rank 0's store takes the port next
}

std::unique_ptr<NodeLink::Impl> join_as_spoke(const NodeLinkConfig& cfg, const NodeHello& self,
                                              const std::function<bool()>& cancelled) {
  const auto deadline = Clock::now() + cfg.join_timeout;
  const std::string where = cfg.master_addr + ":" + std::to_string(cfg.master_port);
  std::string last_problem = "nothing tried yet";
  bool said_waiting = false;
  auto pause = [&](milliseconds ms) {
    const auto until = std::min(Clock::now() + ms, deadline);
    while (Clock::now() < until) {
      if (cancelled && cancelled()) throw NodeJoinError("stopped while waiting for node 0 at " + where);
      std::this_thread::sleep_for(milliseconds(50));
    }
  };
  while (Clock::now() < deadline) {
    if (cancelled && cancelled()) throw NodeJoinError("stopped while waiting for node 0 at " + where);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(cfg.master_addr.c_str(), std::to_string(cfg.master_port).c_str(), &hints, &res);
    if (gai != 0) {
      if (gai != EAI_AGAIN)
        throw LaunchError("master address '" + cfg.master_addr + "' does not resolve (" + ::gai_strerror(gai) +
                          "); give node 0's host name or IP address with --master-addr");
      last_problem = std::string("resolving it: ") + ::gai_strerror(gai);
      pause(milliseconds(500));
      continue;
    }
    int fd = -1;
    std::string address;
    for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
      fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
        last_problem = std::strerror(errno);
        close_fd(fd);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      int err = ETIMEDOUT;
      if (::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 1, 2000))) == 1) {
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
      if (err != 0) {
        last_problem = std::strerror(err);
        close_fd(fd);
        continue;
      }
      sockaddr_storage sa{};
      std::memcpy(&sa, ai->ai_addr, std::min<std::size_t>(ai->ai_addrlen, sizeof sa));
      address = peer_address(sa);
    }
    ::freeaddrinfo(res);
    if (fd < 0) {
      if (!said_waiting) say(cfg, "waiting for node 0 at " + where + " (" + last_problem + ")");
      said_waiting = true;
      pause(milliseconds(500));
      continue;
    }
    set_socket_options(fd);
    if (!send_all(fd, encode_frame(static_cast<std::uint16_t>(LinkKind::hello), encode_hello(self)))) {
      last_problem = "the connection broke while saying hello";
      close_fd(fd);
      pause(milliseconds(500));
      continue;
    }
    say(cfg, "connected to node 0 at " + where + "; waiting for every node to join");
    said_waiting = true;
    // Node 0 answers once every node has joined.
    std::string in;
    for (;;) {
      if (cancelled && cancelled()) {
        close_fd(fd);
        throw NodeJoinError("stopped while waiting for every node to join at " + where);
      }
      if (Clock::now() >= deadline) {
        close_fd(fd);
        throw NodeJoinError("node 0 at " + where + " accepted this node, but not every node joined within " +
                            seconds_text(cfg.join_timeout) + " (join_timeout)");
      }
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 100);
      const int rc = read_into(fd, in);
      std::optional<Frame> f;
      try {
        f = pop_frame(in);
      } catch (const FrameError& e) {
        close_fd(fd);
        throw NodeJoinError("the server at " + where + " is not airhost's node 0 (" + e.what() +
                            "); check --master-addr and --master-port");
      }
      if (f && f->kind == static_cast<std::uint16_t>(LinkKind::refuse)) {
        auto fields = decode_fields(f->payload);
        close_fd(fd);
        if (fields["kind"] == "join") throw NodeJoinError(fields["message"]);
        throw LaunchError(fields["message"]);
      }
      if (f && f->kind == static_cast<std::uint16_t>(LinkKind::welcome)) {
        auto fields = decode_fields(f->payload);
        auto impl = std::make_unique<NodeLink::Impl>();
        impl->cfg = cfg;
        impl->nodes.resize(static_cast<std::size_t>(cfg.nnodes));
        for (int r = 0; r < cfg.nnodes; ++r) impl->nodes[static_cast<std::size_t>(r)].node_rank = r;
        NodeHello zero;
        zero.node_rank = 0;
        zero.nnodes = cfg.nnodes;
        zero.nprocs = cfg.nprocs;
        zero.host = fields["host"].empty() ? cfg.master_addr : fields["host"];
        zero.address = address;
        impl->nodes[0] = zero;
        impl->nodes[static_cast<std::size_t>(cfg.node_rank)] = self;
        NodeLink::Impl::Conn c;
        c.fd = fd;
        c.node = zero;
        c.in = std::move(in);
        impl->conns.push_back(std::move(c));
        say(cfg, "all " + std::to_string(cfg.nnodes) + " nodes joined at " + describe_node(zero) + "; starting the ranks");
        return impl;
      }
      if (rc <= 0) {  // node 0 went away before answering (restarted?): connect again
        close_fd(fd);
        last_problem = "node 0 closed the connection before every node joined";
        say(cfg, last_problem + "; trying again");
        pause(milliseconds(500));
        break;
      }
    }
  }
  throw NodeJoinError("node 0 did not answer at " + where + " within " + seconds_text(cfg.join_timeout) +
                      " (join_timeout; last: " + last_problem + "); start airhost with --node-rank 0 there, with " +
                      "the same --nnodes and --master-port, or check the address and the firewall");
}

}  // namespace

std::unique_ptr<NodeLink> NodeLink::join(const NodeLinkConfig& config, const std::function<bool()>& cancelled) {
  NodeLinkConfig cfg = config;
  NodeHello self;
  self.node_rank = cfg.node_rank;
  self.nnodes = cfg.nnodes;
  self.nprocs = cfg.nprocs;
  self.host = host_name();
  auto impl = cfg.node_rank == 0 ? join_as_hub(cfg, self, cancelled) : join_as_spoke(cfg, self, cancelled);
  impl->heartbeat = cfg.heartbeat.count() > 0 ? cfg.heartbeat
                                              : std::clamp(cfg.node_timeout / 3, milliseconds(100), milliseconds(1000));
  return std::unique_ptr<NodeLink>(new NodeLink(std::move(impl)));
}

}  // namespace airhost::detail
