// link_group.hpp — the group's agreement, as one node of a multi-node run knows it: for each
// attempt, which nodes are down (failed, stopped or lost) and which are done; for each peer,
// whether its connection is gone. Pure: no sockets, no threads, no clock; the node link's
// thread owns one (under its mutex) and feeds it what the wire says.
//
// Keyed by attempt so that a group restart (every node starting its ranks again) begins with
// a clean slate while a late report of the attempt before is still told apart. After a failed
// attempt every node says it has stopped its ranks, and whether it wants a restart (it was
// not interrupted nor timed out, and restarts are left); node 0 decides for all once every
// node has stopped, or one is gone: a restart only when every node wants one. A connection
// that is gone stays gone across attempts: the node behind it cannot take part in another one.
//
// The star decides who can still speak: node 0 (the hub) hears every node on that node's own
// connection; any other node (a spoke) hears everything through node 0.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace airhost::detail {

// A node joined, then failed, was stopped or was lost.
struct NodeDown {
  int node = -1;
  std::string message;   // whole sentence: "node 1 (gpu-b, 10.0.0.2) was lost: ..."
  bool cascade = false;  // that node only failed because one of its ranks lost a peer
  int attempt = 0;       // the attempt it happened in (as the link's on_down hands it over)
  bool timed_out = false;  // it ended its ranks as a timeout does (--timeout, --on-hang stop):
                           // the other nodes end theirs the same way (exit 124)
  bool hung = false;       // ... because its hang watch found no progress (--on-hang stop)
  bool lost = false;       // the node itself was lost (its airhost gone or silent), not its ranks' error
  bool grow = false;       // node 0 of an elastic job stops the group to take in nodes that came
};

class GroupState {
 public:
  GroupState(int nnodes, int self) : nnodes_(nnodes), self_(self) {}

  int nnodes() const { return nnodes_; }
  int self() const { return self_; }
  bool hub() const { return self_ == 0; }
  // The nodes this one has a connection to: node 0 has one to every other, the others to node 0.
  std::vector<int> peers() const;

  // `report.node` is down in `attempt`, as heard on `from`'s connection (`from` is the node
  // itself when it reports its own teardown, node 0 when it relays, or the node whose
  // connection was lost). True the first time that node is heard of in that attempt: the
  // caller passes it on; a second report of the same node (a cascade after a loss) is noted
  // only as that node having spoken.
  bool report_down(int attempt, const NodeDown& report, int from);
  // `node`'s ranks all succeeded in `attempt` (for this node: it is waiting at the barrier).
  void report_done(int attempt, int node);
  // Node 0 said every node is done (a spoke), or saw it (node 0).
  void end(int attempt);
  // `node` stopped its ranks of the failed `attempt`; `want_restart`: it may start again.
  // `leave` (an elastic job's node whose own ranks failed past max_restarts): it will not, but
  // the group may go on without it.
  void report_stopped(int attempt, int node, bool want_restart, bool leave = false);
  // Node 0 of an elastic job, once it should decide: the nodes the group would go on without
  // (lost, or leaving) when every other node stopped and wants a restart; empty otherwise.
  std::vector<int> go_on_without(int attempt) const;
  // What was decided after `attempt` failed: restart (true) or end (false); nullopt: not yet.
  std::optional<bool> decision(int attempt) const;
  void decide(int attempt, bool restart);
  // Node 0 is to decide, nothing being decided yet: this node stopped, and every other node
  // stopped or is gone, or one stopped for good (it wants no restart).
  bool should_decide(int attempt) const;
  // Node 0's verdict once it should decide: every node stopped and wants a restart, none gone.
  bool restart_agreed(int attempt) const;
  // Node 0, once it should decide: the nodes that were lost in `attempt` (gone, without having
  // stopped for good) when every other node wants a restart, so that the group may wait for
  // them to come back; empty when nobody was lost, or someone does not want a restart.
  std::vector<int> rejoin_wanted(int attempt) const;
  // A node lost in `attempt` came back (node 0 admitted its new airhost): it has a connection
  // anew, and starts the next attempt with the others.
  void came_back(int attempt, int node);
  // `node`'s connection closed or the node was declared lost: nothing more comes from it.
  void connection_gone(int node);
  // The nodes this one follows in `attempt` have ended (their connections closed), so that its
  // own exit cannot cut their records short. Only a node that stopped for a cause of its own
  // (its rank failed, its timeout, Ctrl-C: a report that is neither a cascade nor a loss) is
  // followed, and it follows nobody: node 0 follows each such node, another node follows
  // node 0, which closes once they have. No node waits for one that waits for it, so the chain
  // ends when the failing node does, at any number of nodes. True at once when this node
  // stopped for a cause of its own, or nobody did.
  bool followed_nodes_gone(int attempt) const;
  // An elastic job went on without its lost nodes: `nnodes` nodes from now on, this one `self`,
  // numbered anew, every node connected. What was said of earlier attempts stays theirs.
  void regroup(int nnodes, int self) {
    nnodes_ = nnodes;
    self_ = self;
    gone_.clear();
  }

  bool gone(int node) const { return gone_.count(node) > 0; }
  bool ended(int attempt) const;
  // Every node done in `attempt`, this one included.
  bool all_done(int attempt) const;
  // Node 0 is to tell every node to end: all are done, and it has not said so yet.
  bool should_end(int attempt) const { return hub() && !ended(attempt) && all_done(attempt); }
  // A close of `node`'s connection is expected, not a loss: it said it stops, or it is done,
  // or the group ended.
  bool close_expected(int attempt, int node) const;

  // The most telling report heard in `attempt`: the first that is not a cascade, else the first.
  std::optional<NodeDown> verdict(int attempt) const;
  bool any_down(int attempt) const;
  bool real_down(int attempt) const;  // a report that is not a cascade
  // No peer is left that could still send a report of `attempt`: each one's connection is
  // gone, or it said it stops (after that, only relays of what it heard before).
  bool quiet(int attempt) const;

 private:
  struct Attempt {
    std::set<int> heard;      // nodes reported down
    std::set<int> said_down;  // nodes that reported their own teardown
    std::set<int> own_cause;  // nodes reported down for a cause of their own (not a cascade, not lost)
    std::set<int> done;
    std::set<int> stopped, want_restart, leaving;
    std::optional<bool> decision;
    std::optional<NodeDown> first, first_real;
    bool ended = false;
  };
  const Attempt* find(int attempt) const;

  int nnodes_;
  int self_;
  std::map<int, Attempt> attempts_;
  std::set<int> gone_;
};

}  // namespace airhost::detail
