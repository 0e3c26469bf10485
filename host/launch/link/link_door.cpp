// link_door.cpp — see link_door.hpp.
#include "launch/link/link_door.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "airhost/launch.hpp"
#include "base/util.hpp"
#include "launch/link/link_auth.hpp"

namespace airhost::detail {
namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
}  // namespace

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

void link_say(const NodeLinkConfig& cfg, const std::string& line) {
  if (!cfg.say) return;
  // An elastic job's node without a rank yet: "a node of 2:4".
  const std::string count =
      (cfg.nnodes_min > 0 ? std::to_string(cfg.nnodes_min) + ":" : std::string()) + std::to_string(cfg.nnodes);
  cfg.say((cfg.node_rank < 0 ? std::string("a node") : "node " + std::to_string(cfg.node_rank)) + " of " + count + ": " +
          line);
}

void StrangerLines::say(const NodeLinkConfig& cfg, const std::string& line) {
  tick(cfg);
  if (said_ < kStrangerLines) {
    ++said_;
    link_say(cfg, line);
  } else {
    ++hidden_;
  }
}

void StrangerLines::tick(const NodeLinkConfig& cfg, bool now) {
  if (!now && Clock::now() - since_ < kStrangerWindow) return;
  if (hidden_)
    link_say(cfg, "refused or ignored " + std::to_string(hidden_) + " more connection(s) within " +
                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kStrangerWindow).count()) +
                         " s, not named one by one (the first " + std::to_string(kStrangerLines) + " are above)");
  since_ = Clock::now();
  said_ = 0;
  hidden_ = 0;
}

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

namespace {

// Makes room for one more connection from `address`: past kMaxPendingPerAddress from it, or
// kMaxPending in all, the oldest one still silent is closed (left in `pending`, closed, for the
// caller's turn to drop: its indexes stay as they were; `dropped` says so). False when there is
// no room (every connection held has said hello and awaits its proof).
bool make_room(std::vector<Pending>& pending, const std::string& address, bool& dropped) {
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
  dropped = true;
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

}  // namespace

// Accepts what waits on the listener `l` (kAcceptPerTurn at most). The accepted descriptors
// are owned by their LinkConnection from here (closed with it: refused, dropped, made room
// for, or at the end of the run); until the connection joins, its frames are kept small.
void accept_all(int l, std::vector<Pending>& pending, StrangerLines* strangers) {
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
      // Either the oldest silent one or the newcomer is dropped unheard: counted all the same,
      // so that the strangers' line says how many came.
      bool dropped = false;
      const bool room = make_room(pending, address, dropped);
      if (strangers && (!room || dropped)) strangers->count_unsaid();
      if (!room) continue;  // conn closes the newcomer
      conn.limit_frames(kMaxJoinFrame);
      pending.push_back({std::move(conn), address, Clock::now(), std::nullopt, {}, {}});
    } catch (const std::system_error&) {
      // The connection closed the descriptor; a node that loses its connection connects again.
    }
  }
}

// Drops the connections made room for (closed by make_room), before a turn indexes them.
void prune_pending(std::vector<Pending>& pending) {
  std::erase_if(pending, [](const Pending& p) { return !p.conn.is_open(); });
}

std::string token_on_node_only(const NodeHello& h) {
  return describe_node(h) + " was given a join token and node 0 was not; give every node the same "
                            "AIRHOST_JOIN_TOKEN (or --join-token-file), or none";
}


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
        link_say(d.cfg, "refused " + describe_node(*p.hello) + ": " + problem);
        refuse_one(p, problem);
      }
    }
    d.pending.erase(d.pending.begin() + static_cast<std::ptrdiff_t>(i));
  }
  d.strangers.tick(d.cfg);
  return back;
}

}  // namespace airhost::detail
