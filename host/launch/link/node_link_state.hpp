// node_link_state.hpp — the link's state and its thread (NodeLink::Impl), shared by the two
// files that hold its code: node_link.cpp (the thread's loop, what every node does, the public
// calls) and node_link_hub.cpp (node 0's decisions about the group: restart or end, go on
// without lost nodes, take newcomers in, wait for lost ones to come back). Internal to them.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "launch/link/link_group.hpp"
#include "launch/link/link_join.hpp"
#include "launch/link/link_messages.hpp"
#include "launch/link/link_wire.hpp"
#include "launch/link/node_link.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {


// When the link is destroyed: how long this node's last frames (its report, node 0's "end")
// may take to leave, all connections together, before the connections close anyway.
inline constexpr auto kLastWords = std::chrono::seconds(1);

// NodeLinkConfig::shared_file's largest size (a frame is at most kMaxLinkFrame).
inline constexpr std::size_t kMaxSharedFile = 16 * 1024;

// The link's thread wakes at least every second (its poll's longest wait): a longer gap
// between two of its turns means the whole process was stopped, not only the host's loop.
inline constexpr auto kLinkThreadAway = std::chrono::seconds(3);
// Node 0 of many nodes turns its loop at most once per kMinTurn for what the other nodes send:
// their heartbeats come at as many moments of the second as there are nodes, and a turn costs
// every peer (the poll set, the silence checks), so one turn per heartbeat would make node 0's
// second cost N x N. What they send waits in its socket for 10 ms at most; what this host says
// (its outbox, a stop) still wakes the loop at once. Small jobs keep a turn per event.
inline constexpr auto kMinTurn = std::chrono::milliseconds(10);
inline constexpr std::size_t kCoalesceFromPeers = 16;

struct NodeLink::Impl {
  using Clock = std::chrono::steady_clock;
  using milliseconds = std::chrono::milliseconds;

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
  void send_shared_file();

  // Another node: what node 0 sent is written where this node's shared_file is.
  void take_shared_file(const std::string& text);
  Clock::time_point last_watched = Clock::now(), loop_silent_since{};  // the link's thread alone

  bool hub() const { return me == 0; }

  void say(const std::string& line) const;

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

  void poke();

  void queue(std::string f);

  // ---- on the link's thread

  bool is_gone(const Peer& p) const;

  std::string down_frame(int of_attempt, const NodeDown& d) const;

  // Queues `frame` for `p`. Never waits: a peer with no room left for it (it stopped reading)
  // is lost here. A peer whose end is gone (`closed`) has its output dropped; its close is
  // handled where it belongs, when the loop reads the end of its input (poll reports it as
  // readable or hung up), so that what it said before going is read first.
  void send_to(Peer& p, const std::string& frame);

  void send_outbox(const std::vector<std::string>& frames);

  // The frames queued last, then up to kLastWords for every peer still listening to take them.
  void send_outbox_and_last_words();

  // A report of `d` in `of_attempt`, heard on `from`'s connection (the node itself, node 0
  // relaying, or this node's own finding). The first report of a node is passed on: node 0
  // relays it to the other nodes, and the launcher hears it through on_down.
  void report(int of_attempt, const NodeDown& d, int from, const Peer* came_on);

  // A node that went silent, sent garbage or stopped reading keeps its connection, so that it
  // still hears why this node stops should it merely be frozen; one whose connection closed
  // has none left.
  void lost(Peer& p, const std::string& why, bool closed = false);

  // Node 0: when it and every other node are done, it tells them all to end.
  void end_if_all_done();

  void on_frame(Peer& p, const Frame& f);

  // Node 0, after a failed attempt: once every node has stopped its ranks (or one is gone),
  // restart them all if every node wants it, else end. The attempt moves on before anyone
  // hears of it, so that a report of the new attempt is never taken for the old one's.
  // When nodes were lost and every other one wants a restart, node 0 waits for the lost ones
  // to come back (rejoin_wait) before it decides.
  void decide_if_all_stopped();

  // A node that joins a group under way (it came back, or came to an elastic job) hears its
  // place in it, the attempt it starts with the others, and where rank 0's store is.
  std::string welcome(int node, int of_attempt) const;

  // Node 0 of an elastic job: how many of the nodes held for the next restart are still there.
  // A held node is not a peer (nothing reads it in the loop's turns), so its connection is
  // looked at here: one that closed (its airhost ended or was killed) or sent garbage is let
  // go now, instead of being taken in by a restart of every rank and found lost by the next.
  int held_newcomers();

  // Node 0 of an elastic job, at a restart: the nodes that came meanwhile join the group as its
  // last ranks, after the `base` nodes it has, up to MAX (`into` gets their hellos). Returns the
  // group's new size; welcome_newcomers() then tells them.
  int number_newcomers(int base, std::vector<NodeHello>& into);

  // ... and once the restart of attempt `of` is decided: each numbered newcomer hears its
  // welcome, and becomes a peer at the loop's next turn (this may run while the loop reads the
  // others). The rest (past MAX, or gone) are let go.
  void welcome_newcomers(int of);

  // Node 0 of an elastic job while it runs: takes in the nodes that come, up to MAX, and once
  // scale_up_interval has passed since the group last started, asks every node to stop its
  // ranks so that the group restarts with them (an attempt that is ending anyway takes them in
  // at its own restart).
  void grow_check();

  // Node 0 of an elastic job, after attempt `of` failed with `lost` nodes gone, every other node
  // wanting a restart and at least MIN left: the next attempt is the group of the nodes left,
  // numbered anew without gaps (node 0 stays 0), each told its new rank with the restart. The
  // lost nodes' peers are dropped at the loop's next turn (this may run while it reads them).
  void go_on_without(int of, const std::vector<int>& lost_nodes);

  // Node 0, after attempt `of` failed with `lost` nodes gone and every other node wanting a
  // restart: listens again and takes back each lost node whose airhost comes back (restarted by
  // hand, by Kubernetes, by a script), as torchrun's agents join the next round. True while it
  // still waits; false once it is time to decide: every lost node is back (the restart is then
  // agreed), or join_timeout passed, or the port cannot be had (the job then ends).
  bool rejoin_wait(int of, const std::vector<int>& lost_nodes);

  void on_closed(Peer& p);

  // Takes what `p` sent: frames, then its close.
  void read_from(Peer& p);

  void loop();

  // The host's loop has not turned for node_timeout: nothing watches this node's ranks (no
  // timeout, no reaping, no teardown), so the other nodes must not count on them. Told once,
  // as this node's own report: node 0 hears it (and relays it), and so does on_down here,
  // whose abort() ends the run should the loop come back.
  // A whole process that was stopped (SIGSTOP, a frozen VM) stops this thread too: when it
  // runs again, the loop's silence counts only from then, since the loop was not stuck, merely
  // stopped with it (the other nodes judge that silence themselves).
  void watch_loop(Clock::time_point now);

  void run_loop() noexcept;
};

}  // namespace airhost::detail
