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
#include "launch/link/link_door.hpp"
#include "launch/link/link_messages.hpp"

namespace airhost::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a node waits for node 0's first answer to its hello before it takes what it reached
// for something else than node 0's airhost, and connects again.
constexpr auto kAnswerWait = std::chrono::seconds(3);
std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "unknown";
  return buf;
}

// The nodes that joined, for node 0's line: each named (host, address) in a small job; in a job
// of many, the first few and how many more, so that one line stays one line at 4,096 nodes.
std::string joined_list(const std::vector<std::string>& names) {
  constexpr std::size_t kNamed = 8;
  if (names.size() <= kNamed) return join_list(names);
  std::vector<std::string> first(names.begin(), names.begin() + kNamed);
  return join_list(first) + " and " + std::to_string(names.size() - kNamed) + " more";
}

[[noreturn]] void refuse_all(std::vector<LinkPeer>& joined, const std::string& message, bool join_error) {
  std::vector<LinkConnection*> conns;
  for (auto& p : joined) conns.push_back(&p.conn);
  say_goodbye(conns, link_frame(LinkKind::refuse, {{"message", message}, {"kind", join_error ? "join" : "usage"}}));
  if (join_error) throw NodeJoinError(message);
  throw LaunchError(message);
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
    link_say(cfg, "waiting on port " + std::to_string(cfg.master_port) + " for " + std::to_string(want_min) + " to " +
                 std::to_string(want_max) + " other node(s) to join (--nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                 std::to_string(cfg.nnodes) + "): the job starts once " + std::to_string(want_min) +
                 " joined and no other came for " + duration_text(cfg.join_settle) + " (join_settle), or at once when " +
                 std::to_string(want_max) + " did");
  else
    link_say(cfg, "waiting on port " + std::to_string(cfg.master_port) + " for " + std::to_string(cfg.nnodes - 1) +
                 " other node(s) to join");
  if (cfg.join_token.empty())
    link_say(cfg, "the join is open: any host that reaches port " + std::to_string(cfg.master_port) +
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
    link_say(cfg, describe_node(h) + " joined" + (auth ? " (its join token checked)" : ""));
  };
  for (;;) {
    const int n = static_cast<int>(joined.size());
    if (n >= want_max) break;
    if (elastic && n >= want_min) {
      if (Clock::now() - last_arrival >= cfg.join_settle || Clock::now() >= deadline) break;
      if (!said_enough)
        link_say(cfg, std::to_string(n + 1) + " nodes here, enough for --nnodes " + std::to_string(cfg.nnodes_min) + ":" +
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
    prune_pending(pending);
    std::vector<pollfd> fds = {{l4, POLLIN, 0}, {l6, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.conn.fd(), POLLIN, 0});
    for (auto& p : joined) fds.push_back({p.conn.fd(), POLLIN, 0});
    const std::size_t pending_polled = pending.size(), joined_polled = joined.size();
    ::poll(fds.data(), fds.size(), elastic && n >= want_min ? 20 : 100);
    accept_all(l4, pending, &strangers);
    accept_all(l6, pending, &strangers);
    // Only what poll() named is read: a turn costs the connections that spoke, not all of them.
    std::vector<bool> spoke(pending.size(), true);  // accepted just now: not polled yet
    for (std::size_t i = 0; i < pending_polled; ++i) spoke[i] = fds[2 + i].revents != 0;

    // A node that joined and left again (killed, restarted) is waited for anew; looked at
    // first, so that its new hello is not taken for a second node of the same rank.
    bool left = false;
    for (std::size_t i = joined_polled; i-- > 0;) {
      if (!fds[2 + pending_polled + i].revents || joined[i].conn.receive() != LinkIo::closed) continue;
      link_say(cfg, describe_node(joined[i].node) + " left before every node joined; waiting for it again");
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
    (void)p.conn.send(
        message_frame(LinkKind::welcome, encode_welcome({0, group.nnodes, p.node.node_rank, self.host, cfg.store_port})));
  }
  group.peers = std::move(joined);
  if (elastic)
    link_say(cfg, std::to_string(group.nnodes) + " nodes joined (--nnodes " + std::to_string(cfg.nnodes_min) + ":" +
                 std::to_string(cfg.nnodes) + "): " + joined_list(names) + "; starting the ranks");
  else
    link_say(cfg, "all " + std::to_string(group.nnodes) + " nodes joined (" + joined_list(names) + "); starting the ranks");
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
      if (!said_waiting) link_say(cfg, "waiting for node 0 at " + where + " (" + last_problem + ")");
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
    link_say(cfg, "connected to node 0 at " + where + "; waiting for every node to join");
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
          Place place = decode_place(f->payload);
          JoinedGroup group;
          // The group node 0 made: an elastic job's size and this node's rank in it (a fixed
          // count's are the ones given, which node 0 checked).
          if (place.nodes < 0) place.nodes = cfg.nnodes;
          if (place.node_rank < 0) place.node_rank = cfg.node_rank;
          if (!place_fits(place, cfg.nnodes))
            throw NodeJoinError("node 0 at " + where + " welcomed this node as node " + std::to_string(place.node_rank) +
                                " of " + std::to_string(place.nodes) + ", which does not fit --nnodes " +
                                std::to_string(cfg.nnodes) + "; install the same airhost version on every node");
          group.nnodes = place.nodes;
          group.node_rank = place.node_rank;
          group.store_port = place.store_port;
          group.nodes.resize(static_cast<std::size_t>(group.nnodes));
          for (int r = 0; r < group.nnodes; ++r) group.nodes[static_cast<std::size_t>(r)].node_rank = r;
          NodeHello zero;
          zero.node_rank = 0;
          zero.nnodes = cfg.nnodes;
          zero.nnodes_min = cfg.nnodes_min;
          zero.nprocs = cfg.nprocs;
          zero.host = place.host.empty() ? cfg.master_addr : place.host;
          zero.address = address;
          group.nodes[0] = zero;
          NodeHello me = self;
          me.node_rank = group.node_rank;
          group.nodes[static_cast<std::size_t>(group.node_rank)] = me;
          group.attempt = place.attempt;
          // Frames node 0 sent after its welcome stay in the connection for the link's thread.
          group.peers.push_back({zero, std::move(conn)});
          NodeLinkConfig now = cfg;  // said as the node it is now
          now.node_rank = group.node_rank, now.nnodes = group.nnodes, now.nnodes_min = 0;
          link_say(now, group.attempt > 0 ? "came back to the job at " + describe_node(zero) + ", which restarts every node: "
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
        link_say(cfg, last_problem + "; trying again");
        pause(milliseconds(500));
        again = true;
      } else if (!answered && Clock::now() - hello_sent > kAnswerWait) {
        // Rank 0's store of an attempt under way (node 0 listens again only between attempts,
        // when this node was lost), or another program: not node 0's airhost, not yet.
        last_problem = "what answers there is not node 0's airhost yet (rank 0's store of an attempt under way?)";
        link_say(cfg, last_problem + "; trying again");
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

JoinedGroup join_group(const NodeLinkConfig& cfg, const std::function<bool()>& cancelled) {
  const NodeHello self = self_hello(cfg);
  return cfg.node_rank == 0 ? join_as_hub(cfg, self, cancelled) : join_as_spoke(cfg, self, cancelled);
}

}  // namespace airhost::detail
