// link_join.cpp — see link_join.hpp.
#include "launch/link/link_join.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "airhost/launch.hpp"
#include "base/util.hpp"
#include "launch/link/link_auth.hpp"

namespace airhost::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An accepted connection must say hello (and, with a join token, prove it) within this, or it
// is dropped (a port scanner, a stray client of a previous run's store, an idle flood). A real
// node sends its hello as soon as it is connected.
constexpr auto kHelloWait = std::chrono::seconds(5);
// Connections that have not joined, node 0 holds at most this many, and this many from one
// address: past either, the oldest that has not even said hello makes room for the newest (a
// real node says hello at once, and one dropped unheard connects again: kAnswerWait). Nothing
// a stranger does before it is authenticated can use up node 0's descriptors or memory.
constexpr std::size_t kMaxPending = 64;
constexpr std::size_t kMaxPendingPerAddress = 16;
// Connections taken from the backlog per turn: the rest wait in the kernel's queue.
constexpr int kAcceptPerTurn = 32;
// How long a node waits for node 0's first answer to its hello before it takes what it reached
// for something else than node 0's airhost, and connects again.
constexpr auto kAnswerWait = std::chrono::seconds(3);
// How long a refusal may take to leave, all connections together, before node 0 gives up.
constexpr auto kGoodbyeWait = std::chrono::seconds(1);

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown";
  return buf;
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

void say(const NodeLinkConfig& cfg, const std::string& line) {
  if (!cfg.say) return;
  // An elastic job's node without a rank yet: "a node of 2:4".
  const std::string count =
      (cfg.nnodes_min > 0 ? std::to_string(cfg.nnodes_min) + ":" : std::string()) + std::to_string(cfg.nnodes);
  cfg.say((cfg.node_rank < 0 ? std::string("a node") : "node " + std::to_string(cfg.node_rank)) + " of " + count + ": " +
          line);
}

// What node 0 says of strangers on its port (a scanner, a health check, a flood of junk, a
// node with the wrong token): the first kStrangerLines of each kStrangerWindow one by one, the
// rest counted and said in one line once the window is over, so that a flood neither fills
// the log nor costs the join its time.
constexpr int kStrangerLines = 5;
constexpr auto kStrangerWindow = std::chrono::seconds(10);

class StrangerLines {
 public:
  void say(const NodeLinkConfig& cfg, const std::string& line) {
    tick(cfg);
    if (said_ < kStrangerLines) {
      ++said_;
      detail::say(cfg, line);
    } else {
      ++hidden_;
    }
  }
  // The count of a window that is over; with `now`, of this one too (the join is done).
  void tick(const NodeLinkConfig& cfg, bool now = false) {
    if (!now && Clock::now() - since_ < kStrangerWindow) return;
    if (hidden_)
      detail::say(cfg, "refused or ignored " + std::to_string(hidden_) + " more connection(s) within " +
                           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kStrangerWindow).count()) +
                           " s, not named one by one (the first " + std::to_string(kStrangerLines) + " are above)");
    since_ = Clock::now();
    said_ = 0;
    hidden_ = 0;
  }

 private:
  Clock::time_point since_ = Clock::now();
  int said_ = 0;
  long hidden_ = 0;
};

int int_field(const std::string& text, int fallback) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(text, &used);
    return used == text.size() ? v : fallback;
  } catch (const std::exception&) {
    return fallback;
  }
}


// The nodes that joined, for node 0's line: each named (host, address) in a small job; in a job
// of many, the first few and how many more, so that one line stays one line at 4,096 nodes.
std::string joined_list(const std::vector<std::string>& names) {
  constexpr std::size_t kNamed = 8;
  if (names.size() <= kNamed) return join_list(names);
  std::vector<std::string> first(names.begin(), names.begin() + kNamed);
  return join_list(first) + " and " + std::to_string(names.size() - kNamed) + " more";
}

void say_goodbye(std::vector<LinkConnection*> conns, const std::string& frame);

// A connection accepted by node 0 that has not joined yet: no hello yet, or (with a join
// token) a hello whose proof has not come yet.
struct Pending {
  LinkConnection conn;
  std::string address;
  Clock::time_point since;
  std::optional<NodeHello> hello;  // said, and challenged: the proof is awaited
  std::string hello_payload;       // as it came, for the proof
  std::string hub_nonce;           // this connection's challenge
};

// One node on a pending connection is refused: it hears why, and leaves (kGoodbyeWait at
// most, since nothing else was queued on it).
void refuse_one(Pending& p, const std::string& message) {
  say_goodbye({&p.conn}, link_frame(LinkKind::refuse, {{"message", message}, {"kind", "usage"}}));
}

// Sends `frame` (if any) to each connection and closes them all, giving the frames kGoodbyeWait in all
// to leave. A connection whose peer is already gone (send says closed) just closes: there is
// no one left to tell.
void say_goodbye(std::vector<LinkConnection*> conns, const std::string& frame) {
  if (!frame.empty())
    for (LinkConnection* c : conns) (void)c->send(frame);  // full cannot happen: nothing else was queued
  flush_all(conns, Clock::now() + kGoodbyeWait);
  for (LinkConnection* c : conns) c->close_gently();
}

[[noreturn]] void refuse_all(std::vector<LinkPeer>& joined, const std::string& message, bool join_error) {
  std::vector<LinkConnection*> conns;
  for (auto& p : joined) conns.push_back(&p.conn);
  say_goodbye(conns, link_frame(LinkKind::refuse, {{"message", message}, {"kind", join_error ? "join" : "usage"}}));
  if (join_error) throw NodeJoinError(message);
  throw LaunchError(message);
}

// Makes room for one more connection from `address`: past kMaxPendingPerAddress from it, or
// kMaxPending in all, the oldest one still silent is closed (left in `pending`, closed, for the
// caller's turn to drop: its indexes stay as they were). False when there is no room (every
// connection held has said hello and awaits its proof).
bool make_room(std::vector<Pending>& pending, const std::string& address) {
  std::size_t open = 0, from_address = 0;
  for (const auto& p : pending)
    if (p.conn.is_open()) {
      ++open;
      from_address += p.address == address;
    }
  const bool per_address = from_address >= kMaxPendingPerAddress;
  if (!per_address && open < kMaxPending) return true;
  Pending* oldest = nullptr;
  for (auto& p : pending)
    if (p.conn.is_open() && !p.hello && (!per_address || p.address == address) && (!oldest || p.since < oldest->since))
      oldest = &p;
  if (!oldest) return false;
  oldest->conn.close();
  return true;
}

// A descriptor kept free for accept() when the process has none left (EMFILE): the connection
// at the head of the backlog is then taken and closed at once, instead of staying there and
// making every poll return at once (a loop spinning a core while nothing can be accepted).
void shed_one(int l) {
  static int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (spare < 0) return;
  ::close(spare);
  const int fd = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

// Accepts what waits on the listener `l` (kAcceptPerTurn at most). The accepted descriptors
// are owned by their LinkConnection from here (closed with it: refused, dropped, made room
// for, or at the end of the run); until the connection joins, its frames are kept small.
void accept_all(int l, std::vector<Pending>& pending) {
  if (l < 0) return;
  for (int n = 0; n < kAcceptPerTurn; ++n) {
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    const int fd = ::accept4(l, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) shed_one(l);
      return;  // EAGAIN: none left; anything else: that client gave up, not ours to fix
    }
    try {
      LinkConnection conn(fd);
      const std::string address = peer_address(sa);
      if (!make_room(pending, address)) continue;  // conn closes the newcomer
      conn.limit_frames(kMaxJoinFrame);
      pending.push_back({std::move(conn), address, Clock::now(), std::nullopt, {}, {}});
    } catch (const std::system_error&) {
      // The connection closed the descriptor; a node that loses its connection connects again.
    }
  }
}

// Drops the connections made room for (closed by make_room), before a turn indexes them.
void prune(std::vector<Pending>& pending) {
  std::erase_if(pending, [](const Pending& p) { return !p.conn.is_open(); });
}

std::string token_on_node_only(const NodeHello& h) {
  return describe_node(h) + " was given a join token and node 0 was not; give every node the same "
                            "AIRHOST_JOIN_TOKEN (or --join-token-file), or none";
}

// What a pending connection came to, once what it sent is read.
enum class Arrival {
  waiting,            // nothing whole yet, or its proof is awaited
  admitted,           // p.hello holds who it is, checked against the token if there is one
  dropped,            // refused (said here, and told to it) or not a node at all; p.conn may be closed
  token_on_node_only, // it holds a token and node 0 none: p.hello says who
};

// Reads what `p` sent and takes the join one step on: a hello (with a token: challenged, and
// answered with the proof node 0 expects), a proof. A stranger (no proof, a wrong or replayed
// one, bytes that are not link frames, silence past kHelloWait) is dropped with one line here
// naming where it came from, and the reason told to it, so the job goes on waiting for the
// real node. On an open join a hello is answered at once (`heard`), so that a node that
// reached something else on the port knows it.
Arrival advance(const NodeLinkConfig& cfg, Pending& p, StrangerLines& strangers) {
  const bool auth = !cfg.join_token.empty();
  auto refuse_stranger = [&](const std::string& why, const std::string& to_node) {
    strangers.say(cfg, "refused a join from " + p.address + (p.hello ? " as node " + std::to_string(p.hello->node_rank) : "") +
                 ": " + why);
    refuse_one(p, to_node);
    return Arrival::dropped;
  };
  const LinkIo got = p.conn.receive();
  std::optional<Frame> f;
  bool garbage = false;
  try {
    f = p.conn.next_frame();
    if (f && !p.hello && f->kind == static_cast<std::uint16_t>(LinkKind::hello)) {
      NodeHello h = decode_hello(f->payload);
      h.address = p.address;
      p.hello = h;
      if (!auth && !h.nonce.empty()) return Arrival::token_on_node_only;
      if (!auth) {
        (void)p.conn.send(link_frame(LinkKind::heard));
        return Arrival::admitted;
      }
      if (h.nonce.empty())
        return refuse_stranger("it holds no join token (a node started without one, or not one of this job's)",
                               "node 0 admits only nodes holding this job's join token; give this node the same "
                               "AIRHOST_JOIN_TOKEN (or --join-token-file) as node 0");
      p.hello_payload = f->payload;
      p.hub_nonce = fresh_nonce();
      (void)p.conn.send(link_frame(LinkKind::challenge,
                                   {{"nonce", p.hub_nonce}, {"proof", hub_proof(cfg.join_token, h.nonce, p.hub_nonce)}}));
      return Arrival::waiting;
    }
    if (f && p.hello && f->kind == static_cast<std::uint16_t>(LinkKind::proof)) {
      const std::string expected = node_proof(cfg.join_token, p.hub_nonce, p.hello->nonce, p.hello_payload);
      if (!same_digest(decode_fields(f->payload)["proof"], expected))
        return refuse_stranger("its proof of the join token is wrong (another token, or a proof replayed from an "
                               "earlier join)",
                               "node 0 refused this node's join token: it is not node 0's; give every node the same "
                               "AIRHOST_JOIN_TOKEN (or --join-token-file)");
      return Arrival::admitted;
    }
  } catch (const FrameError&) {
    garbage = true;
  }
  if (garbage || f) {  // bytes that are not link frames, or a frame out of turn
    strangers.say(cfg, p.hello ? "refused a join from " + p.address + " as node " + std::to_string(p.hello->node_rank) +
                                     ": it sent something else than the proof of its join token"
                               : "ignored a connection from " + p.address + ": it does not speak airhost's node link");
    return Arrival::dropped;
  }
  if (got == LinkIo::closed || Clock::now() - p.since > kHelloWait) {
    if (p.hello && got != LinkIo::closed)
      strangers.say(cfg, "refused a join from " + p.address + " as node " + std::to_string(p.hello->node_rank) +
                             ": no proof of its join token came within " +
                   duration_text(std::chrono::duration_cast<milliseconds>(kHelloWait)));
    return Arrival::dropped;
  }
  return Arrival::waiting;
}

// The nodes disagree: before node 0 gives up, the nodes still on their way (up to `missing`
// of them, for a few seconds) get the same refusal, so that they too exit 2 at once instead
// of waiting out the join timeout for a node 0 that has gone.
void refuse_late_joiners(int l4, int l6, std::vector<Pending>& pending, const std::string& message, int missing) {
  const std::string refusal = link_frame(LinkKind::refuse, {{"message", message}, {"kind", "usage"}});
  const auto until = Clock::now() + std::chrono::seconds(3);
  std::vector<Pending> answered;
  while (missing > 0 && Clock::now() < until) {
    std::vector<pollfd> fds = {{l4, POLLIN, 0}, {l6, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.conn.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 100);
    accept_all(l4, pending);
    accept_all(l6, pending);
    for (std::size_t i = 0; i < pending.size();) {
      Pending& p = pending[i];
      const LinkIo got = p.conn.receive();
      bool done_with = got == LinkIo::closed;
      try {
        if (auto hello = p.conn.next_frame(); hello && hello->kind == static_cast<std::uint16_t>(LinkKind::hello)) {
          (void)p.conn.send(refusal);  // closed: that node left already; the rest leaves in the goodbye below
          answered.push_back(std::move(p));
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          --missing;
          continue;
        }
      } catch (const FrameError&) {
        done_with = true;  // not a node: just close it
      }
      if (done_with) {
        p.conn.close_gently();
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
  }
  std::vector<LinkConnection*> conns;
  for (auto& p : answered) conns.push_back(&p.conn);
  say_goodbye(conns, {});  // the refusals are queued already: only flush and close
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
  // Every node of a job connects at about the same moment: a backlog shorter than the job drops
  // the surplus SYNs, and each dropped node tries again only after TCP's 1 s retransmission.
  // The kernel caps it at net.core.somaxconn (4096 by default since Linux 5.4).
  if (rc < 0 || ::listen(fd, SOMAXCONN > 4096 ? SOMAXCONN : 4096) < 0) {
    error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

NodeHello self_hello(const NodeLinkConfig& cfg) {
  NodeHello self;
  self.node_rank = cfg.node_rank;
  self.nnodes = cfg.nnodes;
  self.nnodes_min = cfg.nnodes_min;
  self.nprocs = cfg.nprocs;
  self.max_restarts = cfg.max_restarts;
  self.host = host_name();
  return self;
}

JoinedGroup join_as_hub(const NodeLinkConfig& cfg, const NodeHello& self, const std::function<bool()>& cancelled) {
  std::string error;
  int l4 = listen_on(AF_INET, cfg.master_port, error);
  if (l4 < 0)
    throw LaunchError("node 0 cannot listen on port " + std::to_string(cfg.master_port) + ": " + error +
                      "; pick another --master-port and give it to every node");
  std::string ignored;
  int l6 = listen_on(AF_INET6, cfg.master_port, ignored);  // no IPv6 here: IPv4 alone
  // The listeners close whichever way this ends: rank 0's store takes the port next.
  struct Listeners {
    int& a;
    int& b;
    ~Listeners() {
      for (int* fd : {&a, &b})
        if (*fd >= 0) ::close(*fd);
    }
  } listeners{l4, l6};

  // Strangers, late or refused with the rest, close with their LinkConnection.
  std::vector<Pending> pending;
  std::vector<LinkPeer> joined;
  StrangerLines strangers;
  const auto deadline = Clock::now() + cfg.join_timeout;
  // An elastic job (--nnodes MIN:MAX) starts with the nodes that came: once MIN-1 others joined
  // and none came for join_settle, or at once when MAX-1 did.
  const bool elastic = cfg.nnodes_min > 0;
  const int want_max = cfg.nnodes - 1, want_min = elastic ? cfg.nnodes_min - 1 : want_max;
  auto last_arrival = Clock::now();
  bool said_enough = false;
  if (elastic)
    say(cfg, "waiting on port " + std::to_string(cfg.master_port) + " for " + std::to_string(want_min) + " to " +
                 std::to_string(want_max) + " other node(s) to join (--nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                 std::to_string(cfg.nnodes) + "): the job starts once " + std::to_string(want_min) +
                 " joined and no other came for " + duration_text(cfg.join_settle) + " (join_settle), or at once when " +
                 std::to_string(want_max) + " did");
  else
    say(cfg, "waiting on port " + std::to_string(cfg.master_port) + " for " + std::to_string(cfg.nnodes - 1) +
                 " other node(s) to join");
  if (cfg.join_token.empty())
    say(cfg, "the join is open: any host that reaches port " + std::to_string(cfg.master_port) +
                 " may join as a node; give every node the same AIRHOST_JOIN_TOKEN (or --join-token-file) to admit "
                 "only this job's");
  const bool auth = !cfg.join_token.empty();
  // A node admitted: checked against node 0 and the nodes before it (its node rank), or every
  // node is refused. One check per node, whatever the number that joined before it: the join
  // stays linear in the number of nodes.
  std::vector<int> node_rank_of;  // node rank -> index in `joined`, or -1; sized nnodes
  node_rank_of.assign(static_cast<std::size_t>(std::max(cfg.nnodes, 1)), -1);
  auto admit = [&](NodeHello h, LinkConnection conn) {
    conn.limit_frames(kMaxLinkFrame);  // one of the job's nodes from here
    last_arrival = Clock::now();
    joined.push_back({h, std::move(conn)});
    std::string problem = check_nodes(self, {h});
    if (problem.empty() && h.node_rank >= 0) {
      int& seen = node_rank_of.at(static_cast<std::size_t>(h.node_rank));  // checked in range above
      if (seen >= 0) problem = check_nodes(self, {joined[static_cast<std::size_t>(seen)].node, h});
      else seen = static_cast<int>(joined.size()) - 1;
    }
    if (!problem.empty()) {
      refuse_late_joiners(l4, l6, pending, problem, cfg.nnodes - 1 - static_cast<int>(joined.size()));
      refuse_all(joined, problem, false);
    }
    say(cfg, describe_node(h) + " joined" + (auth ? " (its join token checked)" : ""));
  };
  for (;;) {
    const int n = static_cast<int>(joined.size());
    if (n >= want_max) break;
    if (elastic && n >= want_min) {
      if (Clock::now() - last_arrival >= cfg.join_settle || Clock::now() >= deadline) break;
      if (!said_enough)
        say(cfg, std::to_string(n + 1) + " nodes here, enough for --nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                     std::to_string(cfg.nnodes) + "; starting once no other node comes for " +
                     duration_text(cfg.join_settle));
      said_enough = true;
    }
    if (cancelled && cancelled()) refuse_all(joined, "node 0 was stopped while the nodes joined", true);
    if (Clock::now() >= deadline && elastic) {
      refuse_all(joined,
                 "only " + std::to_string(n + 1) + " node(s) joined node 0 (" + self.host + ", port " +
                     std::to_string(cfg.master_port) + ") within " + duration_text(cfg.join_timeout) +
                     " (join_timeout), and the job needs at least " + std::to_string(cfg.nnodes_min) + " (--nnodes " +
                     std::to_string(cfg.nnodes_min) + ":" + std::to_string(cfg.nnodes) +
                     "); start airhost with the same --nnodes, --master-addr and --master-port on more nodes, and "
                     "check that they can reach this one",
                 true);
    }
    if (Clock::now() >= deadline) {
      std::set<int> here;
      for (auto& p : joined) here.insert(p.node.node_rank);
      std::vector<int> missing;
      for (int r = 1; r < cfg.nnodes; ++r)
        if (!here.count(r)) missing.push_back(r);
      refuse_all(joined,
                 "node" + std::string(missing.size() > 1 ? "s " : " ") + rank_ranges(missing) + " did not join node 0 (" +
                     self.host + ", port " + std::to_string(cfg.master_port) + ") within " +
                     duration_text(cfg.join_timeout) + " (join_timeout); start airhost with the same --nnodes, " +
                     "--master-addr and --master-port on every node, and check that they can reach this one",
                 true);
    }
    prune(pending);
    std::vector<pollfd> fds = {{l4, POLLIN, 0}, {l6, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.conn.fd(), POLLIN, 0});
    for (auto& p : joined) fds.push_back({p.conn.fd(), POLLIN, 0});
    const std::size_t pending_polled = pending.size(), joined_polled = joined.size();
    ::poll(fds.data(), fds.size(), elastic && n >= want_min ? 20 : 100);
    accept_all(l4, pending);
    accept_all(l6, pending);
    // Only what poll() named is read: a turn costs the connections that spoke, not all of them.
    std::vector<bool> spoke(pending.size(), true);  // accepted just now: not polled yet
    for (std::size_t i = 0; i < pending_polled; ++i) spoke[i] = fds[2 + i].revents != 0;

    // A node that joined and left again (killed, restarted) is waited for anew; looked at
    // first, so that its new hello is not taken for a second node of the same rank.
    bool left = false;
    for (std::size_t i = joined_polled; i-- > 0;) {
      if (!fds[2 + pending_polled + i].revents || joined[i].conn.receive() != LinkIo::closed) continue;
      say(cfg, describe_node(joined[i].node) + " left before every node joined; waiting for it again");
      joined.erase(joined.begin() + static_cast<std::ptrdiff_t>(i));  // closes its connection
      left = true;
    }
    if (left) {
      node_rank_of.assign(node_rank_of.size(), -1);
      for (std::size_t i = 0; i < joined.size(); ++i)
        if (joined[i].node.node_rank >= 0) node_rank_of.at(static_cast<std::size_t>(joined[i].node.node_rank)) = static_cast<int>(i);
    }
    // Connections that have not said hello yet, or whose proof is awaited: those that spoke,
    // and those whose time to speak is up.
    const auto now = Clock::now();
    for (std::size_t i = 0, k = 0; i < pending.size(); ++k) {
      Pending& p = pending[i];
      if (!spoke[k] && now - p.since <= kHelloWait) {
        ++i;
        continue;
      }
      const Arrival got = advance(cfg, p, strangers);
      if (got == Arrival::waiting) {
        ++i;
        continue;
      }
      if (got == Arrival::token_on_node_only) {
        // One side was given a token and the other not: the job is set up wrong, not attacked.
        std::vector<LinkPeer> all;
        all.push_back({*p.hello, std::move(p.conn)});
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        for (auto& j : joined) all.push_back(std::move(j));
        refuse_all(all, token_on_node_only(all.front().node), false);
      }
      if (got == Arrival::admitted) admit(*p.hello, std::move(p.conn));
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    strangers.tick(cfg);
  }
  strangers.tick(cfg, true);
  JoinedGroup group;
  group.nnodes = static_cast<int>(joined.size()) + 1;
  group.node_rank = 0;
  group.store_port = cfg.store_port;
  group.nodes.resize(static_cast<std::size_t>(group.nnodes));
  group.nodes[0] = self;
  // By node rank; an elastic job's nodes without one after those with one, in the order they
  // came (stable), and then numbered 1.. without gaps: the group of this attempt.
  std::stable_sort(joined.begin(), joined.end(), [](auto& a, auto& b) {
    return std::pair(a.node.node_rank < 0, a.node.node_rank) < std::pair(b.node.node_rank < 0, b.node.node_rank);
  });
  std::vector<std::string> names;
  for (std::size_t i = 0; i < joined.size(); ++i) {
    auto& p = joined[i];
    if (elastic) p.node.node_rank = static_cast<int>(i) + 1;
    group.nodes[static_cast<std::size_t>(p.node.node_rank)] = p.node;
    names.push_back(describe_node(p.node));
    // A fresh socket takes a welcome at once; what it does not take waits in the buffer for
    // the link's thread. `closed`: that node left this very moment; its connection stays,
    // and the link's thread, finding it closed, reports the node lost at once.
    (void)p.conn.send(link_frame(LinkKind::welcome, {{"host", self.host},
                                                     {"nodes", std::to_string(group.nnodes)},
                                                     {"node_rank", std::to_string(p.node.node_rank)},
                                                     {"store_port", std::to_string(cfg.store_port)}}));
  }
  group.peers = std::move(joined);
  if (elastic)
    say(cfg, std::to_string(group.nnodes) + " nodes joined (--nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                 std::to_string(cfg.nnodes) + "): " + joined_list(names) + "; starting the ranks");
  else
    say(cfg, "all " + std::to_string(group.nnodes) + " nodes joined (" + joined_list(names) + "); starting the ranks");
  return group;  // the listeners close here: rank 0's store takes the port next
}

// Connects to node 0 once: a connected socket, or -1 with `problem` saying why not.
int connect_once(const NodeLinkConfig& cfg, Clock::time_point deadline, std::string& address, std::string& problem) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(cfg.master_addr.c_str(), std::to_string(cfg.master_port).c_str(), &hints, &res);
  if (gai != 0) {
    if (gai != EAI_AGAIN)
      throw LaunchError("master address '" + cfg.master_addr + "' does not resolve (" + ::gai_strerror(gai) +
                        "); give node 0's host name or IP address with --master-addr");
    problem = std::string("resolving it: ") + ::gai_strerror(gai);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
      problem = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    int err = ETIMEDOUT;
    if (::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 1, 2000))) == 1) {
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    }
    if (err != 0) {
      problem = std::strerror(err);
      ::close(fd);
      fd = -1;
      continue;
    }
    sockaddr_storage sa{};
    std::memcpy(&sa, ai->ai_addr, std::min<std::size_t>(ai->ai_addrlen, sizeof sa));
    address = peer_address(sa);
  }
  ::freeaddrinfo(res);
  return fd;
}

JoinedGroup join_as_spoke(const NodeLinkConfig& cfg, const NodeHello& self, const std::function<bool()>& cancelled) {
  const auto deadline = Clock::now() + cfg.join_timeout;
  const std::string where = cfg.master_addr + ":" + std::to_string(cfg.master_port);
  std::string last_problem = "nothing tried yet";
  bool said_waiting = false;
  auto pause = [&](milliseconds ms) {
    const auto until = std::min(Clock::now() + ms, deadline);
    while (Clock::now() < until) {
      if (cancelled && cancelled()) throw NodeJoinError("stopped while waiting for node 0 at " + where);
      std::this_thread::sleep_for(std::min(milliseconds(50), ms));
    }
  };
  // Node 0 not listening yet (started a moment later, as every node of a job is): tried again
  // soon, then less and less often. No event says a remote port opened, so the first tries come
  // quickly: a job whose nodes start together joins in tens of milliseconds, not half a second.
  milliseconds retry{20};
  while (Clock::now() < deadline) {
    if (cancelled && cancelled()) throw NodeJoinError("stopped while waiting for node 0 at " + where);
    std::string address;
    const int fd = connect_once(cfg, deadline, address, last_problem);
    if (fd < 0) {
      if (!said_waiting) say(cfg, "waiting for node 0 at " + where + " (" + last_problem + ")");
      said_waiting = true;
      pause(retry);
      retry = std::min(retry * 3 / 2, milliseconds(500));
      continue;
    }
    LinkConnection conn;
    try {
      conn = LinkConnection(fd);  // owns fd from here, closed with it whichever way this ends
    } catch (const std::system_error& e) {
      last_problem = e.what();
      pause(milliseconds(500));
      continue;
    }
    // A fresh socket takes a hello whole at once; `closed` means node 0 went as we came. With a
    // join token, each connection says hello with a nonce of its own (link_auth.hpp).
    NodeHello hello = self;
    if (!cfg.join_token.empty()) hello.nonce = fresh_nonce();
    const std::string hello_payload = encode_hello(hello);
    bool challenged = false;
    if (conn.send(encode_frame(static_cast<std::uint16_t>(LinkKind::hello), hello_payload)) != LinkIo::ok) {
      last_problem = "the connection broke while saying hello";
      pause(milliseconds(500));
      continue;
    }
    say(cfg, "connected to node 0 at " + where + "; waiting for every node to join");
    said_waiting = true;
    // Node 0 answers a hello at once (a challenge, `heard`, a refusal), and welcomes the node
    // once every node has joined. Silence means something else holds the port.
    const auto hello_sent = Clock::now();
    bool answered = false;
    for (bool again = false; !again;) {
      if (cancelled && cancelled()) throw NodeJoinError("stopped while waiting for every node to join at " + where);
      if (Clock::now() >= deadline)
        throw NodeJoinError("node 0 at " + where + " accepted this node, but not every node joined within " +
                            duration_text(cfg.join_timeout) + " (join_timeout)");
      pollfd p{conn.fd(), conn.poll_events(), 0};
      ::poll(&p, 1, 100);
      LinkIo got = LinkIo::ok;
      if (p.revents & POLLOUT) got = conn.flush();
      if (got == LinkIo::ok) got = conn.receive();
      try {
        while (auto f = conn.next_frame()) {
          answered = true;
          if (f->kind == static_cast<std::uint16_t>(LinkKind::refuse)) {
            auto fields = decode_fields(f->payload);
            if (fields["kind"] == "join") throw NodeJoinError(fields["message"]);
            throw LaunchError(fields["message"]);
          }
          if (f->kind == static_cast<std::uint16_t>(LinkKind::challenge)) {
            auto fields = decode_fields(f->payload);
            if (cfg.join_token.empty())
              throw LaunchError("node 0 at " + where + " admits only nodes holding this job's join token; give this "
                                "node the same AIRHOST_JOIN_TOKEN (or --join-token-file) as node 0");
            if (!same_digest(fields["proof"], hub_proof(cfg.join_token, hello.nonce, fields["nonce"])))
              throw LaunchError("the airhost at " + where + " could not prove it holds this job's join token: it is "
                                "not this job's node 0, or its token differs; check --master-addr and give every "
                                "node the same token");
            challenged = true;
            (void)conn.send(link_frame(LinkKind::proof,
                                       {{"proof", node_proof(cfg.join_token, fields["nonce"], hello.nonce, hello_payload)}}));
            continue;
          }
          if (f->kind != static_cast<std::uint16_t>(LinkKind::welcome)) continue;  // a later version's
          if (!cfg.join_token.empty() && !challenged)
            throw LaunchError("node 0 at " + where + " welcomed this node without checking its join token: it "
                              "holds none, or is not this job's node 0; give every node the same token");
          auto fields = decode_fields(f->payload);
          JoinedGroup group;
          // The group node 0 made: an elastic job's size and this node's rank in it (a fixed
          // count's are the ones given, which node 0 checked).
          group.nnodes = int_field(fields["nodes"], cfg.nnodes);
          group.node_rank = int_field(fields["node_rank"], cfg.node_rank);
          if (group.nnodes < 2 || group.nnodes > cfg.nnodes || group.node_rank < 1 || group.node_rank >= group.nnodes)
            throw NodeJoinError("node 0 at " + where + " welcomed this node as node " + fields["node_rank"] + " of " +
                                fields["nodes"] + ", which does not fit --nnodes " + std::to_string(cfg.nnodes) +
                                "; install the same airhost version on every node");
          group.store_port = int_field(fields["store_port"], 0);
          group.nodes.resize(static_cast<std::size_t>(group.nnodes));
          for (int r = 0; r < group.nnodes; ++r) group.nodes[static_cast<std::size_t>(r)].node_rank = r;
          NodeHello zero;
          zero.node_rank = 0;
          zero.nnodes = cfg.nnodes;
          zero.nnodes_min = cfg.nnodes_min;
          zero.nprocs = cfg.nprocs;
          zero.host = fields["host"].empty() ? cfg.master_addr : fields["host"];
          zero.address = address;
          group.nodes[0] = zero;
          NodeHello me = self;
          me.node_rank = group.node_rank;
          group.nodes[static_cast<std::size_t>(group.node_rank)] = me;
          try {
            group.attempt = fields["attempt"].empty() ? 0 : std::max(0, std::stoi(fields["attempt"]));
          } catch (...) {
            group.attempt = 0;
          }
          // Frames node 0 sent after its welcome stay in the connection for the link's thread.
          group.peers.push_back({zero, std::move(conn)});
          NodeLinkConfig now = cfg;  // said as the node it is now
          now.node_rank = group.node_rank, now.nnodes = group.nnodes, now.nnodes_min = 0;
          say(now, group.attempt > 0 ? "came back to the job at " + describe_node(zero) + ", which restarts every node: "
                                           "starting the ranks as restart " + std::to_string(group.attempt)
                                     : "all " + std::to_string(group.nnodes) + " nodes joined at " + describe_node(zero) +
                                           "; starting the ranks");
          return group;
        }
      } catch (const FrameError& e) {
        throw NodeJoinError("the server at " + where + " is not airhost's node 0 (" + e.what() +
                            "); check --master-addr and --master-port");
      }
      if (got == LinkIo::closed) {  // node 0 went away before answering (restarted?): connect again
        last_problem = "node 0 closed the connection before every node joined";
        say(cfg, last_problem + "; trying again");
        pause(milliseconds(500));
        again = true;
      } else if (!answered && Clock::now() - hello_sent > kAnswerWait) {
        // Rank 0's store of an attempt under way (node 0 listens again only between attempts,
        // when this node was lost), or another program: not node 0's airhost, not yet.
        last_problem = "what answers there is not node 0's airhost yet (rank 0's store of an attempt under way?)";
        say(cfg, last_problem + "; trying again");
        pause(milliseconds(500));
        again = true;
      }
    }
  }
  throw NodeJoinError("node 0 did not answer at " + where + " within " + duration_text(cfg.join_timeout) +
                      " (join_timeout; last: " + last_problem + "); start airhost with --node-rank 0 there, with " +
                      "the same --nnodes and --master-port, or check the address and the firewall");
}

}  // namespace

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

// ---- the checks -----------------------------------------------------------------------------

std::string check_nodes(const NodeHello& self, const std::vector<NodeHello>& peers) {
  auto named = [](const NodeHello& n) {  // a node whose rank may be the problem
    return n.host + (n.address.empty() || n.address == n.host ? "" : " (" + n.address + ")");
  };
  for (const auto& p : peers)
    if (p.version != self.version)
      return "the node on " + named(p) + " speaks node link protocol " + std::to_string(p.version) + ", " +
             describe_node(self) + " speaks " + std::to_string(self.version) +
             "; install the same airhost version on every node";
  auto count = [](const NodeHello& n) {
    return (n.nnodes_min > 0 ? std::to_string(n.nnodes_min) + ":" : std::string()) + std::to_string(n.nnodes);
  };
  for (const auto& p : peers)
    if (p.nnodes != self.nnodes || p.nnodes_min != self.nnodes_min)
      return "the nodes disagree on the number of nodes: " + describe_node(self) + " was given --nnodes " + count(self) +
             ", the node on " + named(p) + " --nnodes " + count(p) + "; give every node the same --nnodes";
  for (const auto& p : peers) {
    if (p.node_rank < 0 && self.nnodes_min > 0) continue;  // an elastic job's node: node 0 numbers it
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
  for (const auto& p : peers)
    if (p.max_restarts != self.max_restarts)
      return "the nodes disagree on --max-restarts: " + describe_node(self) + " was given " +
             std::to_string(self.max_restarts) + ", " + describe_node(p) + " " + std::to_string(p.max_restarts) +
             "; the group restarts on every node together, so give every node the same --max-restarts";
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

// ---- the desk for nodes that come back -----------------------------------------------------

struct RejoinDesk::Impl {
  NodeLinkConfig cfg;
  NodeHello self;
  int l4 = -1, l6 = -1;
  std::vector<Pending> pending;
  StrangerLines strangers;
  ~Impl() {
    for (int fd : {l4, l6})
      if (fd >= 0) ::close(fd);
  }
};

RejoinDesk::RejoinDesk(const NodeLinkConfig& config) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = config;
  impl_->self = self_hello(config);
  std::string error;
  impl_->l4 = listen_on(AF_INET, config.master_port, error);
  if (impl_->l4 < 0)
    throw LaunchError("node 0 cannot listen on port " + std::to_string(config.master_port) + " again: " + error);
  std::string ignored;
  impl_->l6 = listen_on(AF_INET6, config.master_port, ignored);
}

RejoinDesk::~RejoinDesk() = default;  // the listeners close, and whoever was on the way

void RejoinDesk::add_poll_fds(std::vector<pollfd>& fds) const {
  for (int fd : {impl_->l4, impl_->l6})
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  for (const auto& p : impl_->pending) fds.push_back({p.conn.fd(), POLLIN, 0});
}

std::vector<LinkPeer> RejoinDesk::take(const std::vector<int>& wanted) {
  Impl& d = *impl_;
  accept_all(d.l4, d.pending);
  accept_all(d.l6, d.pending);
  std::vector<LinkPeer> back;
  for (std::size_t i = 0; i < d.pending.size();) {
    Pending& p = d.pending[i];
    const Arrival got = advance(d.cfg, p, d.strangers);
    if (got == Arrival::waiting) {
      ++i;
      continue;
    }
    std::string problem;
    if (got == Arrival::token_on_node_only) problem = token_on_node_only(*p.hello);
    else if (got == Arrival::admitted) {
      problem = check_nodes(d.self, {*p.hello});
      if (problem.empty() && d.self.nnodes_min > 0) {
        // An elastic job: a node that comes takes the place of one that was lost, whatever rank
        // it was started with (node 0 numbers the nodes of each attempt).
        std::vector<int> open;
        for (int n : wanted)
          if (std::none_of(back.begin(), back.end(), [n](const LinkPeer& b) { return b.node.node_rank == n; }))
            open.push_back(n);
        if (open.empty())
          problem = "the job has all the nodes it can take now (--nnodes " + std::to_string(d.self.nnodes_min) + ":" +
                    std::to_string(d.self.nnodes) + ")";
        else p.hello->node_rank = open.front();
      } else if (problem.empty() && std::find(wanted.begin(), wanted.end(), p.hello->node_rank) == wanted.end())
        problem = "node " + std::to_string(p.hello->node_rank) + " of this job is still in it; only a node that was "
                  "lost may join again, with its own --node-rank";
    }
    if (got != Arrival::dropped) {
      if (problem.empty()) {
        p.conn.limit_frames(kMaxLinkFrame);  // one of the job's nodes from here
        back.push_back({*p.hello, std::move(p.conn)});
      }
      else {
        say(d.cfg, "refused " + describe_node(*p.hello) + ": " + problem);
        refuse_one(p, problem);
      }
    }
    d.pending.erase(d.pending.begin() + static_cast<std::ptrdiff_t>(i));
  }
  d.strangers.tick(d.cfg);
  return back;
}

JoinedGroup join_group(const NodeLinkConfig& cfg, const std::function<bool()>& cancelled) {
  const NodeHello self = self_hello(cfg);
  return cfg.node_rank == 0 ? join_as_hub(cfg, self, cancelled) : join_as_spoke(cfg, self, cancelled);
}

}  // namespace airhost::detail
