// node_link.cpp — the link's thread: its poll loop, heartbeats and the public calls (see
// node_link.hpp for the protocol; the wire, the join and the agreement have files of their own).
#include "launch/link/node_link.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// When the link is destroyed: how long this node's last frames (its report, node 0's "end")
// may take to leave, all connections together, before the connections close anyway.
constexpr auto kLastWords = std::chrono::seconds(1);

// NodeLinkConfig::shared_file's largest size (a frame is at most kMaxLinkFrame).
constexpr std::size_t kMaxSharedFile = 16 * 1024;

// The link's thread wakes at least every second (its poll's longest wait): a longer gap
// between two of its turns means the whole process was stopped, not only the host's loop.
constexpr auto kLinkThreadAway = std::chrono::seconds(3);
// Node 0 of many nodes turns its loop at most once per kMinTurn for what the other nodes send:
// their heartbeats come at as many moments of the second as there are nodes, and a turn costs
// every peer (the poll set, the silence checks), so one turn per heartbeat would make node 0's
// second cost N x N. What they send waits in its socket for 10 ms at most; what this host says
// (its outbox, a stop) still wakes the loop at once. Small jobs keep a turn per event.
constexpr auto kMinTurn = std::chrono::milliseconds(10);
constexpr std::size_t kCoalesceFromPeers = 16;

int to_int(const std::string& s, int fallback) {
  try {
    return std::stoi(s);
  } catch (...) {
    return fallback;
  }
}

// Every signal but the faults: those stay deliverable, since a fault raised on this thread
// while blocked ends the process without the host's crash handling.
sigset_t signals_blocked_in_link_thread() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&set, sig);
  return set;
}

}  // namespace

struct NodeLink::Impl {
  // The node at the other end of a connection, as the loop sees it.
  struct Peer {
    NodeHello node;
    LinkConnection conn;      // owns the socket; closed when the node leaves or the link ends
    std::uint64_t heard = 0;  // conn.bytes_received() when last looked at
    Clock::time_point last_rx;
    bool got_file = false;    // node 0: shared_file went to it
    bool dropped = false;     // node 0: a lost node an elastic job went on without (removed at the loop's top)
  };

  Impl(const NodeLinkConfig& config, JoinedGroup joined)
      : cfg(config),
        me(joined.node_rank >= 0 ? joined.node_rank : config.node_rank),
        group_size(joined.nnodes > 0 ? joined.nnodes : config.nnodes),
        group(group_size, me) {
    store_port = joined.store_port;
    nodes = std::move(joined.nodes);
    attempt = joined.attempt;
    for (auto& p : joined.peers) peers.push_back({std::move(p.node), std::move(p.conn), 0, Clock::now()});
  }

  NodeLinkConfig cfg;  // as given: who this node says it is at a join (an elastic job's range)
  // This node's rank and the number of nodes in the group it joined: cfg's for a fixed count;
  // an elastic job's as node 0 numbered them.
  int me = 0;
  int group_size = 1;
  milliseconds heartbeat{1000};
  std::vector<NodeHello> nodes;
  std::vector<Peer> peers;  // node 0: one per other node; another node: one, to node 0
  // Other threads wake the loop through this pipe (both ends ours: made in start(),
  // close-on-exec so no rank inherits them, closed in ~Impl after the thread has ended).
  int wake[2] = {-1, -1};
  std::thread thread;
  std::function<void(const NodeDown&)> on_down;
  NodeLink::StacksHandlers stacks;  // set before the thread starts
  // The attempt under way, the same on every node: node 0 moves it on when it decides a
  // restart, another node when it hears so. Frames carry it, so that a late report of an
  // earlier attempt is told apart.
  std::atomic<int> attempt{0};
  std::atomic<std::uint64_t> turns{0};  // the loop's wake-ups (NodeLink::turns)

  mutable std::mutex m;  // guards what follows; `peers` belongs to the loop's thread alone
  std::condition_variable cv;
  std::vector<std::string> outbox;  // frames for every peer, queued by other threads
  bool stop = false;
  GroupState group;

  // When the host's loop last turned (steady clock, ns); 0 while it is not watched. Set by
  // the loop's thread, read by the link's.
  std::atomic<std::int64_t> loop_turned{0};
  bool loop_stuck = false;  // the link's thread alone: this node said its loop is stuck

  // Node 0 after a failed attempt in which nodes were lost, while every other node wants a
  // restart: the desk where they may come back, until rejoin_deadline (join_timeout). The link's
  // thread alone.
  std::unique_ptr<RejoinDesk> desk;
  Clock::time_point rejoin_deadline{};
  std::set<int> came_back;  // nodes that came back in this wait: they get a welcome, not "restart"
  // Node 0 of an elastic job: its desk listens for the whole run (rank 0's store has a port of
  // its own); the nodes that came while the job ran, taken in at the next restart; those taken
  // in, peers from the loop's next turn; when the group last started; whether a restart to
  // take nodes in was asked for in this attempt. The link's thread alone.
  std::vector<LinkPeer> newcomers;
  std::vector<Peer> joining;
  Clock::time_point last_group_start = Clock::now();
  bool grow_asked = false;
  int store_port = 0;  // where rank 0's store listens (JoinedGroup::store_port)

  // Node 0: sends shared_file to every node once it exists (and to a node that came back).
  void send_shared_file() {
    if (me != 0 || cfg.shared_file.empty()) return;
    if (std::all_of(peers.begin(), peers.end(), [this](const Peer& p) { return p.got_file || is_gone(p); })) return;
    UniqueFd fd(::open(cfg.shared_file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return;  // not yet
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd.get(), buf, sizeof buf)) > 0 && text.size() <= kMaxSharedFile)
      text.append(buf, static_cast<std::size_t>(n));
    const std::string f = text.size() > kMaxSharedFile ? std::string() : link_frame(LinkKind::file, {{"text", text}});
    for (auto& p : peers)
      if (!p.got_file && !is_gone(p)) {
        p.got_file = true;
        if (!f.empty()) send_to(p, f);
      }
  }

  // Another node: what node 0 sent is written where this node's shared_file is.
  void take_shared_file(const std::string& text) {
    if (me == 0 || cfg.shared_file.empty()) return;
    try {
      write_file_atomic(cfg.shared_file, text);
    } catch (const std::exception& e) {
      say("cannot write " + cfg.shared_file + " as node 0 sent it: " + e.what());
    }
  }
  Clock::time_point last_watched = Clock::now(), loop_silent_since{};  // the link's thread alone

  bool hub() const { return me == 0; }

  void say(const std::string& line) const {
    if (cfg.say) cfg.say("node " + std::to_string(me) + " of " + std::to_string(group_size) + ": " + line);
  }

  ~Impl() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    poke();
    if (thread.joinable()) thread.join();
    else send_outbox_and_last_words();  // never started: this is the only thread left
    for (auto& p : peers) p.conn.close_gently();
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }

  void poke() {
    if (wake[1] >= 0) {
      const char b = 1;
      // EAGAIN: the pipe is full of pokes already, so the loop wakes anyway.
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

  bool is_gone(const Peer& p) const {
    if (p.dropped) return true;
    std::lock_guard lock(m);
    return group.gone(p.node.node_rank);
  }

  std::string down_frame(int of_attempt, const NodeDown& d) const {
    return link_frame(LinkKind::down, {{"node", std::to_string(d.node)},
                                       {"message", d.message},
                                       {"cascade", d.cascade ? "1" : "0"},
                                       {"timed_out", d.timed_out ? "1" : "0"},
                                       {"hung", d.hung ? "1" : "0"},
                                       {"lost", d.lost ? "1" : "0"},
                                       {"grow", d.grow ? "1" : "0"},
                                       {"attempt", std::to_string(of_attempt)}});
  }

  // Queues `frame` for `p`. Never waits: a peer with no room left for it (it stopped reading)
  // is lost here. A peer whose end is gone (`closed`) has its output dropped; its close is
  // handled where it belongs, when the loop reads the end of its input (poll reports it as
  // readable or hung up), so that what it said before going is read first.
  void send_to(Peer& p, const std::string& frame) {
    if (!p.conn.is_open()) return;
    if (p.conn.send(frame) == LinkIo::full && !is_gone(p))
      lost(p, "it stopped reading what this node sends (" + std::to_string(p.conn.output_pending() / 1024) +
                  " KiB waiting for it, the most a node may fall behind is " +
                  std::to_string(kLinkOutputCap / 1024) + " KiB)");
  }

  void send_outbox(const std::vector<std::string>& frames) {
    for (const auto& f : frames)
      for (auto& p : peers) send_to(p, f);
  }

  // The frames queued last, then up to kLastWords for every peer still listening to take them.
  void send_outbox_and_last_words() {
    std::vector<std::string> frames;
    {
      std::lock_guard lock(m);
      frames.swap(outbox);
    }
    send_outbox(frames);
    std::vector<LinkConnection*> listening;
    for (auto& p : peers)
      if (!is_gone(p)) listening.push_back(&p.conn);  // a lost node would only hold us up
    flush_all(listening, Clock::now() + kLastWords);
  }

  // A report of `d` in `of_attempt`, heard on `from`'s connection (the node itself, node 0
  // relaying, or this node's own finding). The first report of a node is passed on: node 0
  // relays it to the other nodes, and the launcher hears it through on_down.
  void report(int of_attempt, const NodeDown& d, int from, const Peer* came_on) {
    bool fresh;
    {
      std::lock_guard lock(m);
      fresh = group.report_down(of_attempt, d, from);
    }
    cv.notify_all();
    if (!fresh) return;
    if (hub()) {
      const std::string f = down_frame(of_attempt, d);
      for (auto& p : peers)
        if (&p != came_on) send_to(p, f);
    }
    if (of_attempt == attempt && on_down) {
      NodeDown heard = d;
      heard.attempt = of_attempt;
      on_down(heard);
    }
  }

  // A node that went silent, sent garbage or stopped reading keeps its connection, so that it
  // still hears why this node stops should it merely be frozen; one whose connection closed
  // has none left.
  void lost(Peer& p, const std::string& why, bool closed = false) {
    if (closed) p.conn.close();
    {
      std::lock_guard lock(m);
      group.connection_gone(p.node.node_rank);
    }
    NodeDown d{p.node.node_rank, describe_node(p.node) + " was lost: " + why, false};
    d.lost = true;
    report(attempt, d, me, &p);
  }

  // Node 0: when it and every other node are done, it tells them all to end.
  void end_if_all_done() {
    {
      std::lock_guard lock(m);
      if (!group.should_end(attempt)) return;
      group.end(attempt);
    }
    cv.notify_all();
    const std::string f = link_frame(LinkKind::end, {{"attempt", std::to_string(attempt)}});
    for (auto& p : peers) send_to(p, f);
  }

  void on_frame(Peer& p, const Frame& f) {
    const int from = p.node.node_rank;
    switch (static_cast<LinkKind>(f.kind)) {
      case LinkKind::down: {
        auto fields = decode_fields(f.payload);
        NodeDown d{to_int(fields["node"], -1), fields["message"], fields["cascade"] == "1"};
        d.timed_out = fields["timed_out"] == "1";
        d.hung = fields["hung"] == "1";
        d.lost = fields["lost"] == "1";
        d.grow = fields["grow"] == "1";
        report(to_int(fields["attempt"], 0), d, from, &p);  // no attempt: a peer before attempts, so 0
        break;
      }
      case LinkKind::done: {
        std::lock_guard lock(m);
        group.report_done(to_int(decode_fields(f.payload)["attempt"], 0), from);
        break;
      }
      case LinkKind::end: {
        std::lock_guard lock(m);
        group.end(to_int(decode_fields(f.payload)["attempt"], 0));
        break;
      }
      case LinkKind::stopped: {  // node 0 hears it
        auto fields = decode_fields(f.payload);
        std::lock_guard lock(m);
        group.report_stopped(to_int(fields["attempt"], 0), from, fields["restart"] == "1", fields["leave"] == "1");
        break;
      }
      case LinkKind::restart: {  // a spoke hears node 0's decision: the next attempt begins now
        auto fields = decode_fields(f.payload);
        const int next = to_int(fields["attempt"], 0);
        std::lock_guard lock(m);
        if (next == attempt + 1) {
          group.decide(attempt, true);
          attempt = next;
          // An elastic job that went on without lost nodes: this node's place in the new group.
          const int k = to_int(fields["nodes"], group_size), r = to_int(fields["node_rank"], me);
          if ((k != group_size || r != me) && k >= 2 && k <= cfg.nnodes && r >= 1 && r < k) {  // no larger than MAX
            NodeHello self = nodes[static_cast<std::size_t>(me)], zero = nodes[0];
            self.node_rank = r;
            nodes.assign(static_cast<std::size_t>(k), NodeHello{});
            for (int i = 0; i < k; ++i) nodes[static_cast<std::size_t>(i)].node_rank = i;
            nodes[0] = zero;
            nodes[static_cast<std::size_t>(r)] = self;
            me = r;
            group_size = k;
            group.regroup(k, r);
          }
        }
        break;
      }
      case LinkKind::final: {
        std::lock_guard lock(m);
        group.decide(to_int(decode_fields(f.payload)["attempt"], 0), false);
        break;
      }
      case LinkKind::file:
        take_shared_file(decode_fields(f.payload)["text"]);
        break;
      case LinkKind::stacks_ask:
        if (!hub() && stacks.on_ask) {
          auto fields = decode_fields(f.payload);
          stacks.on_ask(static_cast<unsigned>(to_int(fields["seq"], 0)), fields["only"]);
        }
        break;
      case LinkKind::stacks:
        if (hub() && stacks.on_answer) {
          auto fields = decode_fields(f.payload);
          stacks.on_answer(from, static_cast<unsigned>(to_int(fields["seq"], 0)), fields["ranks"]);
        }
        break;
      default:
        break;  // heartbeats (hearing anything is what counts), and kinds of a later version
    }
    cv.notify_all();
    end_if_all_done();
    decide_if_all_stopped();
  }

  // Node 0, after a failed attempt: once every node has stopped its ranks (or one is gone),
  // restart them all if every node wants it, else end. The attempt moves on before anyone
  // hears of it, so that a report of the new attempt is never taken for the old one's.
  // When nodes were lost and every other one wants a restart, node 0 waits for the lost ones
  // to come back (rejoin_wait) before it decides.
  void decide_if_all_stopped() {
    int of;
    bool restart;
    std::vector<int> lost_nodes, without;
    {
      std::lock_guard lock(m);
      of = attempt;
      if (!group.should_decide(of)) return;
      restart = group.restart_agreed(of);
      if (!restart) lost_nodes = group.rejoin_wanted(of);
      if (!restart && cfg.nnodes_min > 0) without = group.go_on_without(of);
    }
    // An elastic job with enough nodes left goes on at once without the lost ones, and without
    // those whose own ranks failed past max_restarts (they leave). The nodes held for the next
    // scale-up count: they are taken in with that restart (go_on_without numbers them).
    if (!without.empty()) {
      const int kept = group_size - static_cast<int>(without.size());
      if (kept + std::min(held_newcomers(), cfg.nnodes - kept) >= cfg.nnodes_min) return go_on_without(of, without);
    }
    if (!lost_nodes.empty() && rejoin_wait(of, lost_nodes)) return;
    {
      std::lock_guard lock(m);
      if (group.decision(of)) return;
      restart = group.restart_agreed(of);  // the lost nodes may have come back meanwhile
    }
    // The nodes that came are numbered before the decision is published: the launcher reads the
    // group's size and its rank as soon as it hears "restart".
    std::vector<NodeHello> grown = nodes;
    const int k = restart ? number_newcomers(group_size, grown) : group_size;
    {
      std::lock_guard lock(m);
      if (group.decision(of)) return;
      if (restart && k != group_size) {
        group_size = k;
        group.regroup(k, 0);
        nodes = std::move(grown);
      }
      group.decide(of, restart);
      if (restart) attempt = of + 1;
    }
    rejoin_deadline = {};
    if (cfg.nnodes_min == 0) desk.reset();  // the port is rank 0's store's again (an elastic job's store has its own)
    cv.notify_all();
    if (restart) welcome_newcomers(of);
    // An elastic job's restart says the group's size and each node's rank (nodes came or went).
    auto restart_frame = [&](int node) {
      if (cfg.nnodes_min == 0) return link_frame(LinkKind::restart, {{"attempt", std::to_string(of + 1)}});
      return link_frame(LinkKind::restart, {{"attempt", std::to_string(of + 1)},
                                            {"nodes", std::to_string(group_size)},
                                            {"node_rank", std::to_string(node)}});
    };
    const std::string final_frame = link_frame(LinkKind::final, {{"attempt", std::to_string(of)}});
    for (auto& p : peers) {
      if (is_gone(p)) continue;
      send_to(p, !restart ? final_frame
                          : came_back.count(p.node.node_rank) ? welcome(p.node.node_rank, of + 1)
                                                              : restart_frame(p.node.node_rank));
    }
    came_back.clear();
    if (restart) send_shared_file();
  }

  // A node that joins a group under way (it came back, or came to an elastic job) hears its
  // place in it, the attempt it starts with the others, and where rank 0's store is.
  std::string welcome(int node, int of_attempt) const {
    return link_frame(LinkKind::welcome, {{"host", nodes[0].host},
                                          {"nodes", std::to_string(group_size)},
                                          {"node_rank", std::to_string(node)},
                                          {"attempt", std::to_string(of_attempt)},
                                          {"store_port", std::to_string(store_port)}});
  }

  // Node 0 of an elastic job: how many of the nodes held for the next restart are still there.
  // A held node is not a peer (nothing reads it in the loop's turns), so its connection is
  // looked at here: one that closed (its airhost ended or was killed) or sent garbage is let
  // go now, instead of being taken in by a restart of every rank and found lost by the next.
  int held_newcomers() {
    if (newcomers.empty()) return 0;
    std::vector<pollfd> fds;
    for (auto& n : newcomers) fds.push_back(pollfd{n.conn.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 0) > 0) {
      for (std::size_t i = 0; i < newcomers.size(); ++i) {
        if (!fds[i].revents) continue;
        LinkPeer& n = newcomers[i];
        bool gone = n.conn.receive() == LinkIo::closed;
        try {
          while (n.conn.next_frame()) {}  // it says nothing the group needs before its welcome
        } catch (const FrameError&) {
          gone = true;
        }
        if (!gone) continue;
        say(describe_node(n.node) + " went away before it was taken in; the group goes on as it is");
        n.conn.close();
      }
      std::erase_if(newcomers, [](const LinkPeer& n) { return !n.conn.is_open(); });
    }
    return static_cast<int>(newcomers.size());
  }

  // Node 0 of an elastic job, at a restart: the nodes that came meanwhile join the group as its
  // last ranks, after the `base` nodes it has, up to MAX (`into` gets their hellos). Returns the
  // group's new size; welcome_newcomers() then tells them.
  int number_newcomers(int base, std::vector<NodeHello>& into) {
    int k = base;
    for (auto& n : newcomers) {
      n.node.node_rank = -1;
      if (!n.conn.is_open() || k >= cfg.nnodes) continue;
      n.node.node_rank = k++;
      into.push_back(n.node);
    }
    return k;
  }

  // ... and once the restart of attempt `of` is decided: each numbered newcomer hears its
  // welcome, and becomes a peer at the loop's next turn (this may run while the loop reads the
  // others). The rest (past MAX, or gone) are let go.
  void welcome_newcomers(int of) {
    std::string listed;
    for (auto& n : newcomers) {
      if (!n.conn.is_open() || n.node.node_rank < 0) continue;
      listed += (listed.empty() ? "" : ", ") + describe_node(n.node);
      (void)n.conn.send(welcome(n.node.node_rank, of + 1));
      joining.push_back(Peer{n.node, std::move(n.conn), 0, Clock::now()});
    }
    newcomers.clear();
    last_group_start = Clock::now();
    grow_asked = false;
    if (!listed.empty())
      say(listed + " joined the group: restart " + std::to_string(of + 1) + " with " + std::to_string(group_size) +
          " nodes");
  }

  // Node 0 of an elastic job while it runs: takes in the nodes that come, up to MAX, and once
  // scale_up_interval has passed since the group last started, asks every node to stop its
  // ranks so that the group restarts with them (an attempt that is ending anyway takes them in
  // at its own restart).
  void grow_check() {
    if (!desk || cfg.nnodes_min == 0 || rejoin_deadline != Clock::time_point{}) return;
    std::vector<int> slots;  // the places left, once the held nodes that went are let go
    for (int r = group_size + held_newcomers(); r < cfg.nnodes; ++r) slots.push_back(r);
    for (auto& n : desk->take(slots)) {
      say(describe_node(n.node) + " came; it joins the group at its next restart");
      n.node.node_rank = -1;  // numbered when it is taken in
      newcomers.push_back(std::move(n));
    }
    if (held_newcomers() == 0 || grow_asked || Clock::now() - last_group_start < cfg.scale_up_interval) return;
    {
      std::lock_guard lock(m);
      if (group.any_down(attempt) || group.decision(attempt)) return;
    }
    grow_asked = true;
    std::vector<std::string> names;
    for (const auto& n : newcomers) names.push_back(describe_node(n.node));
    NodeDown d{0, join_list(names) + " came to the job: every node restarts its ranks to "
                  "take " + (newcomers.size() > 1 ? "them" : "it") + " in (--nnodes " + std::to_string(cfg.nnodes_min) +
                  ":" + std::to_string(cfg.nnodes) + ")", false};
    d.grow = true;
    report(attempt, d, me, nullptr);
  }

  // Node 0 of an elastic job, after attempt `of` failed with `lost` nodes gone, every other node
  // wanting a restart and at least MIN left: the next attempt is the group of the nodes left,
  // numbered anew without gaps (node 0 stays 0), each told its new rank with the restart. The
  // lost nodes' peers are dropped at the loop's next turn (this may run while it reads them).
  void go_on_without(int of, const std::vector<int>& lost_nodes) {
    const std::set<int> lost(lost_nodes.begin(), lost_nodes.end());
    // A node that leaves (its ranks failed past max_restarts) is still here: it hears that the
    // job ends for it, and ends by its ranks' outcome. A lost one is gone.
    std::vector<std::string> names;
    const std::string final_frame = link_frame(LinkKind::final, {{"attempt", std::to_string(of)}});
    for (auto& p : peers) {
      if (p.dropped || !lost.count(p.node.node_rank)) continue;
      if (is_gone(p)) {
        names.push_back(describe_node(p.node) + " was lost");
      } else {
        names.push_back(describe_node(p.node) + " left the job (its ranks failed past --max-restarts " +
                        std::to_string(cfg.max_restarts) + ")");
        send_to(p, final_frame);
      }
    }
    std::vector<NodeHello> now{nodes[0]};
    int next = 1;
    for (auto& p : peers) {
      if (p.dropped || lost.count(p.node.node_rank)) {
        p.dropped = true;
        continue;
      }
      p.node.node_rank = next++;
      now.push_back(p.node);
    }
    next = number_newcomers(next, now);  // before the decision is published (decide_if_all_stopped)
    {
      std::lock_guard lock(m);
      if (group.decision(of)) return;
      group.decide(of, true);
      attempt = of + 1;
      group_size = next;
      group.regroup(next, 0);
      nodes = std::move(now);
    }
    rejoin_deadline = {};
    cv.notify_all();
    std::string listed;
    for (std::size_t i = 0; i < names.size(); ++i) listed += (i ? "; " : "") + names[i];
    welcome_newcomers(of);
    say(listed + "; the job goes on with " +
        std::to_string(group_size) + " nodes (--nnodes " + std::to_string(cfg.nnodes_min) + ":" + std::to_string(cfg.nnodes) +
        "): restart " + std::to_string(of + 1) + ", not counted against --max-restarts");
    for (auto& p : peers)
      if (!p.dropped)
        send_to(p, link_frame(LinkKind::restart, {{"attempt", std::to_string(of + 1)},
                                                  {"nodes", std::to_string(group_size)},
                                                  {"node_rank", std::to_string(p.node.node_rank)}}));
    send_shared_file();
  }

  // Node 0, after attempt `of` failed with `lost` nodes gone and every other node wanting a
  // restart: listens again and takes back each lost node whose airhost comes back (restarted by
  // hand, by Kubernetes, by a script), as torchrun's agents join the next round. True while it
  // still waits; false once it is time to decide: every lost node is back (the restart is then
  // agreed), or join_timeout passed, or the port cannot be had (the job then ends).
  bool rejoin_wait(int of, const std::vector<int>& lost_nodes) {
    const auto now = Clock::now();
    if (rejoin_deadline == Clock::time_point{}) {
      if (!desk) {
        try {
          desk = std::make_unique<RejoinDesk>(cfg);
        } catch (const std::exception& e) {
          say(std::string(e.what()) + "; the job cannot wait for the lost node(s) to come back");
          return false;
        }
      }
      rejoin_deadline = now + cfg.join_timeout;
      std::string names;
      for (int n : lost_nodes)
        names += (names.empty() ? "" : ", ") + describe_node(nodes[static_cast<std::size_t>(n)]);
      say("the other nodes want a restart; waiting up to " + duration_text(cfg.join_timeout) +
                " (join_timeout) for " + names + " to come back: start its airhost again with the same arguments");
    }
    std::vector<int> still_lost;
    for (int n : lost_nodes)
      if (!came_back.count(n)) still_lost.push_back(n);
    for (auto& back : desk->take(still_lost)) {
      const int n = back.node.node_rank;
      for (auto& p : peers) {
        if (p.node.node_rank != n) continue;
        p.conn = std::move(back.conn);
        p.node = back.node;
        p.heard = 0;
        p.last_rx = Clock::now();
        p.got_file = false;
      }
      nodes[static_cast<std::size_t>(n)] = back.node;
      came_back.insert(n);
      {
        std::lock_guard lock(m);
        group.came_back(of, n);
      }
      say(describe_node(back.node) + " came back" + (cfg.join_token.empty() ? "" : " (its join token checked)"));
    }
    bool all_back, still_wanted;
    {
      std::lock_guard lock(m);
      all_back = group.restart_agreed(of);
      still_wanted = all_back || !group.rejoin_wanted(of).empty();
    }
    if (all_back) return false;
    if (!still_wanted) return false;  // a node withdrew meanwhile (stopped, or lost for good)
    if (now < rejoin_deadline) return true;
    std::string names;
    for (int n : lost_nodes) names += (names.empty() ? "" : ", ") + std::to_string(n);
    say("node" + std::string(lost_nodes.size() > 1 ? "s " : " ") + names + " did not come back within " +
        duration_text(cfg.join_timeout) + " (join_timeout); the job ends");
    return false;
  }

  void on_closed(Peer& p) {
    bool expected;
    {
      std::lock_guard lock(m);
      expected = group.close_expected(attempt, p.node.node_rank);
      if (expected) group.connection_gone(p.node.node_rank);
    }
    if (!expected) return lost(p, "its connection closed (its airhost exited or was killed)", true);
    p.conn.close();
    cv.notify_all();
    end_if_all_done();
  }

  // Takes what `p` sent: frames, then its close.
  void read_from(Peer& p) {
    const LinkIo got = p.conn.receive();
    if (p.conn.bytes_received() != p.heard) {
      p.heard = p.conn.bytes_received();
      p.last_rx = Clock::now();
    }
    try {
      while (auto f = p.conn.next_frame()) on_frame(p, *f);
    } catch (const FrameError& e) {
      return lost(p, std::string("it sent garbage (") + e.what() + ")");
    }
    if (got == LinkIo::closed) on_closed(p);
  }

  void loop() {
    auto next_beat = Clock::now();
    auto last_turn = Clock::time_point{};
    std::vector<pollfd> fds;
    const std::string beat = link_frame(LinkKind::heartbeat);
    for (;;) {
      // The lost nodes an elastic job went on without (go_on_without), and the nodes it took in
      // (welcome_newcomers), now that no turn reads the peers.
      std::erase_if(peers, [](const Peer& p) { return p.dropped; });
      for (auto& p : joining) peers.push_back(std::move(p));
      joining.clear();
      if (hub()) grow_check();
      std::vector<std::string> frames;
      bool stopping;
      {
        std::lock_guard lock(m);
        frames.swap(outbox);
        stopping = stop;
      }
      send_outbox(frames);
      if (stopping) return send_outbox_and_last_words();
      end_if_all_done();
      decide_if_all_stopped();

      auto now = Clock::now();
      watch_loop(now);
      if (now >= next_beat) {
        send_shared_file();
        // A node whose loop is stuck beats no more: the beats say its ranks are watched.
        if (!loop_stuck)
          for (auto& p : peers)
            if (!is_gone(p)) send_to(p, beat);
        next_beat = now + heartbeat;
      }
      for (auto& p : peers) {
        if (!p.conn.is_open() || is_gone(p) || now - p.last_rx <= cfg.node_timeout) continue;
        // What waits unread is not silence: a node this host could not listen to (this process
        // was stopped, or busy) may have spoken all along, maybe its last words.
        read_from(p);
        if (p.conn.is_open() && !is_gone(p) && Clock::now() - p.last_rx > cfg.node_timeout)
          lost(p, "nothing heard from it for " + duration_text(cfg.node_timeout) + " (node_timeout)");
      }

      // Listening to every peer still in the group; writing to any with output waiting, lost
      // or not (a frozen node may yet thaw and read why the others stopped).
      fds.assign(1, pollfd{wake[0], POLLIN, 0});
      for (auto& p : peers) {
        const bool gone = is_gone(p);
        const short events = gone ? (p.conn.output_pending() ? POLLOUT : 0) : p.conn.poll_events();
        fds.push_back(pollfd{events ? p.conn.fd() : -1, events, 0});  // poll skips -1
      }
      if (desk) desk->add_poll_fds(fds);  // after the peers: their indexes stay as they are
      // Awake for the next heartbeat, and for the moment the quietest peer passes node_timeout.
      auto wake_at = next_beat;
      if (desk) wake_at = std::min(wake_at, now + milliseconds(100));  // a join's steps, and its deadline
      for (auto& p : peers)
        if (p.conn.is_open() && !is_gone(p)) wake_at = std::min(wake_at, p.last_rx + cfg.node_timeout + milliseconds(1));
      now = Clock::now();
      if (peers.size() >= kCoalesceFromPeers && now - last_turn < kMinTurn) {
        pollfd own{wake[0], POLLIN, 0};
        (void)::poll(&own, 1, static_cast<int>(std::chrono::duration_cast<milliseconds>(kMinTurn - (now - last_turn)).count()) + 1);
        now = Clock::now();
      }
      const auto wait = std::chrono::duration_cast<milliseconds>(wake_at - now).count();
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait, 1, 1000))) < 0 && errno != EINTR)
        throw std::system_error(errno, std::generic_category(), "node link: poll");
      last_turn = Clock::now();
      turns.fetch_add(1, std::memory_order_relaxed);
      if (fds[0].revents) {
        char buf[64];
        while (::read(wake[0], buf, sizeof buf) > 0) {
        }
      }
      for (std::size_t i = 0; i < peers.size(); ++i) {
        Peer& p = peers[i];
        const short revents = fds[i + 1].fd < 0 ? 0 : fds[i + 1].revents;
        if (!revents || !p.conn.is_open()) continue;
        // A write error drops the output; the end of the connection is then read below, or,
        // for a lost node, no longer polled.
        if (p.conn.output_pending()) (void)p.conn.flush();
        if (!is_gone(p) && (revents & (POLLIN | POLLHUP | POLLERR))) read_from(p);
      }
    }
  }

  // The host's loop has not turned for node_timeout: nothing watches this node's ranks (no
  // timeout, no reaping, no teardown), so the other nodes must not count on them. Told once,
  // as this node's own report: node 0 hears it (and relays it), and so does on_down here,
  // whose abort() ends the run should the loop come back.
  // A whole process that was stopped (SIGSTOP, a frozen VM) stops this thread too: when it
  // runs again, the loop's silence counts only from then, since the loop was not stuck, merely
  // stopped with it (the other nodes judge that silence themselves).
  void watch_loop(Clock::time_point now) {
    if (now - last_watched > kLinkThreadAway) loop_silent_since = now;
    last_watched = now;
    const std::int64_t turned = loop_turned.load(std::memory_order_relaxed);
    if (loop_stuck || turned == 0) return;
    const auto silent = now - std::max(Clock::time_point(Clock::duration(turned)), loop_silent_since);
    if (silent <= cfg.node_timeout) return;
    loop_stuck = true;
    const NodeHello& self = nodes[static_cast<std::size_t>(me)];
    const NodeDown d{me,
                     describe_node(self) + " stopped: its airhost's loop has not turned for " +
                         duration_text(std::chrono::duration_cast<milliseconds>(silent)) +
                         " (node_timeout), so nothing watches its ranks (a callback of the embedding program "
                         "that does not return, or a write to a file system that hangs)",
                     false};
    if (!hub()) send_outbox({down_frame(attempt, d)});
    report(attempt, d, me, nullptr);  // node 0 relays it to every other node
  }

  void run_loop() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      // Only poll() failing gets here (EFAULT, ENOMEM): with no loop, the others cannot be
      // watched, so this node reports itself lost to the launcher, which stops its ranks.
      report(attempt, NodeDown{me, "the node link of " + describe_node(nodes[static_cast<std::size_t>(me)]) + " failed: " + e.what(), false},
             me, nullptr);
    }
  }
};

NodeLink::NodeLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeLink::~NodeLink() = default;

const std::vector<NodeHello>& NodeLink::nodes() const { return impl_->nodes; }

int NodeLink::attempt() const { return impl_->attempt; }
int NodeLink::store_port() const { return impl_->store_port; }
std::vector<std::string> NodeLink::node_names() const {
  std::lock_guard lock(impl_->m);
  std::vector<std::string> out;
  for (const auto& n : impl_->nodes)
    if (!n.host.empty()) out.push_back(describe_node(n));
  return out;
}
int NodeLink::node_rank() const {
  std::lock_guard lock(impl_->m);
  return impl_->me;
}
int NodeLink::nnodes() const {
  std::lock_guard lock(impl_->m);
  return impl_->group_size;
}
std::uint64_t NodeLink::turns() const { return impl_->turns.load(std::memory_order_relaxed); }

bool NodeLink::after_attempt(bool want_restart, milliseconds limit, const std::function<bool()>& cancelled,
                             bool leave) {
  Impl& s = *impl_;
  int of;
  leave = leave && !want_restart && !s.hub();  // node 0 is the hub: it cannot leave its job
  auto say_stopped = [&](bool restart) {
    {
      std::lock_guard lock(s.m);
      if (s.hub()) s.group.report_stopped(of, 0, restart);
    }
    if (s.hub()) s.poke();  // its loop decides once every node has stopped
    else
      s.queue(link_frame(LinkKind::stopped, {{"attempt", std::to_string(of)},
                                             {"restart", restart ? "1" : "0"},
                                             {"leave", leave && !restart ? "1" : "0"}}));
  };
  {
    std::lock_guard lock(s.m);
    of = s.attempt;
  }
  say_stopped(want_restart);
  // The wait may be long (node 0 waits up to join_timeout for a lost node to come back): a
  // node interrupted meanwhile withdraws, and the job ends everywhere.
  const auto until = limit.count() > 0 ? Clock::now() + limit : Clock::time_point::max();
  auto withdrawn_until = Clock::time_point::max();
  std::unique_lock lock(s.m);
  auto ready = [&] { return s.group.decision(of).has_value() || (!s.hub() && s.group.gone(0)); };
  while (!ready()) {
    const auto now = Clock::now();
    if (now >= until || now >= withdrawn_until) break;
    s.cv.wait_for(lock, milliseconds(100), ready);
    if (ready() || withdrawn_until != Clock::time_point::max() || !cancelled) continue;
    lock.unlock();
    const bool stop = cancelled();
    if (stop && want_restart) say_stopped(false);
    if (stop) withdrawn_until = Clock::now() + std::chrono::seconds(5);
    lock.lock();
  }
  return s.group.decision(of).value_or(false);
}

void NodeLink::start(std::function<void(const NodeDown&)> on_down) {
  Impl& s = *impl_;
  s.on_down = std::move(on_down);
  if (::pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) < 0)
    throw std::system_error(errno, std::generic_category(), "node link: pipe");
  for (auto& p : s.peers) p.last_rx = Clock::now();
  // The thread inherits the mask of the thread that makes it: block everything the host
  // handles for the moment of its creation, so that a SIGINT, SIGTERM or SIGCHLD is never
  // delivered to the link (where it would interrupt a poll and nothing else), only to a
  // thread of the host's, whose loop acts on it.
  const sigset_t blocked = signals_blocked_in_link_thread();
  sigset_t previous;
  if (const int rc = ::pthread_sigmask(SIG_BLOCK, &blocked, &previous); rc != 0)
    throw std::system_error(rc, std::generic_category(), "node link: pthread_sigmask");
  try {
    s.thread = std::thread([&s] { s.run_loop(); });
  } catch (...) {
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // restoring a mask that was in effect cannot fail
}

void NodeLink::loop_alive() noexcept {
  impl_->loop_turned.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

void NodeLink::unwatch_loop() noexcept { impl_->loop_turned.store(0, std::memory_order_relaxed); }

void NodeLink::handle_stacks(StacksHandlers handlers) { impl_->stacks = std::move(handlers); }

void NodeLink::ask_stacks(unsigned seq, const std::string& only) {
  if (impl_->hub()) impl_->queue(link_frame(LinkKind::stacks_ask, {{"seq", std::to_string(seq)}, {"only", only}}));
}

void NodeLink::answer_stacks(unsigned seq, const std::string& ranks) {
  if (!impl_->hub()) impl_->queue(link_frame(LinkKind::stacks, {{"seq", std::to_string(seq)}, {"ranks", ranks}}));
}

void NodeLink::tell_down(const std::string& why, bool cascade, bool timed_out, bool hung) {
  Impl& s = *impl_;
  NodeDown d{s.me, describe_node(s.nodes[static_cast<std::size_t>(s.me)]) + " " + why, cascade};
  d.timed_out = timed_out;
  d.hung = hung;
  s.queue(s.down_frame(s.attempt, d));
}

std::optional<NodeDown> NodeLink::down() const {
  std::lock_guard lock(impl_->m);
  return impl_->group.verdict(impl_->attempt);
}

void NodeLink::wait_followed_nodes(milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lock(s.m);
  s.cv.wait_for(lock, limit, [&] { return s.group.followed_nodes_gone(s.attempt); });
}

std::optional<NodeDown> NodeLink::wait_down(milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lock(s.m);
  s.cv.wait_for(lock, limit, [&] { return s.group.real_down(s.attempt) || s.group.quiet(s.attempt); });
  return s.group.verdict(s.attempt);
}

std::optional<NodeDown> NodeLink::finish(milliseconds limit) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.m);
    s.group.report_done(s.attempt, s.me);
  }
  if (!s.hub()) s.queue(link_frame(LinkKind::done, {{"attempt", std::to_string(s.attempt)}}));
  else s.poke();  // node 0 counts itself done: its loop may now see every node done
  std::unique_lock lock(s.m);
  auto ready = [&] { return s.group.ended(s.attempt) || s.group.any_down(s.attempt); };
  if (limit.count() > 0) s.cv.wait_for(lock, limit, ready);
  else s.cv.wait(lock, ready);
  if (s.group.any_down(s.attempt)) return s.group.verdict(s.attempt);
  if (s.group.ended(s.attempt)) return std::nullopt;
  return NodeDown{-1, "the other nodes did not finish within the run's timeout", false};
}

std::unique_ptr<NodeLink> NodeLink::join(const NodeLinkConfig& config, const std::function<bool()>& cancelled) {
  auto impl = std::make_unique<Impl>(config, join_group(config, cancelled));
  if (impl->hub() && config.nnodes_min > 0) {
    // An elastic job's node 0 listens for the whole run: a node that comes is taken in.
    try {
      impl->desk = std::make_unique<RejoinDesk>(config);
    } catch (const std::exception& e) {
      impl->say(std::string(e.what()) + "; nodes that come while the job runs cannot be taken in");
    }
  }
  impl->heartbeat = config.heartbeat.count() > 0
                        ? config.heartbeat
                        : std::clamp(config.node_timeout / 3, milliseconds(100), milliseconds(1000));
  return std::unique_ptr<NodeLink>(new NodeLink(std::move(impl)));
}

}  // namespace airhost::detail
