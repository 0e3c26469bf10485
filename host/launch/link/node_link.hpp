// node_link.hpp — the hosts of a multi-node run, talking to each other.
//
// Every node's airhost opens one TCP connection to node 0's airhost, on MASTER_ADDR:
// MASTER_PORT (the port users already open for torch's store), before any rank starts:
//
//   join     each node sends a hello (protocol version, node rank, nnodes, ranks per node,
//            host name); node 0 waits for all of them, checks that they agree, and answers
//            every node with a welcome, or with one refusal sentence naming who said what
//            (every node then exits 2, nothing started). Node 0 then closes its listening
//            socket, keeping the accepted connections: rank 0's TCPStore binds the same port
//            next, which Linux allows since every socket left on it has SO_REUSEADDR and
//            none of them listens (see port.hpp for the same rule).
//   run      heartbeats both ways, every second (less for a short node_timeout). A node whose
//            connection closes (its airhost exited or was killed), or that stays silent for
//            node_timeout (cut off, frozen), is lost. The heartbeats stand for the host's loop
//            as well as its link: a node whose loop stops turning while its link thread lives
//            says it is down and stops beating (loop_alive()). A node that tears down its ranks (a rank
//            failed, a timeout, a signal) says so first. Node 0 relays what it hears, so
//            every node learns of every other: the star has node 0 at its centre.
//   finish   a node whose ranks all succeeded says "done" and waits until node 0 has heard
//            it from every node, so that no airhost ends while another node's ranks still
//            need the others (an exit barrier, as torchrun's agents have).
//   restart  with --max-restarts, after a failed attempt every node stops its ranks and says
//            "stopped" (and whether it may start again); node 0 waits for all of them, then
//            tells every node to start again, as the next attempt, or that the job ends.
//            Every node thus restarts together, with the same attempt number, as torchrun's
//            agents do after their rendezvous. A node that was lost (its airhost killed, its
//            pod restarted) may come back: when every other node wants a restart, node 0
//            listens on the port again (rank 0's store has let it go) for up to join_timeout,
//            admits the node's new airhost as at the join (same checks, same token), and
//            welcomes it into the next attempt while the others hear "restart".
//   stacks   `airhost stacks` and the hang watch on node 0 see the whole job: node 0 asks every
//            node for its ranks' stacks (stacks_ask), and each answers with them (stacks),
//            taken by its own host as on one node.
//   file     node 0 sends NodeLinkConfig::shared_file to every node once it exists (the MLflow
//            run its host made), and each node writes it where its own run directory has it.
//
// The link is four files, one per concern: link_wire (frames, the hello, a buffered
// non-blocking connection), link_join (the join, refusals, the nodes' checks), link_group (the
// agreement: who is down, who is done, by attempt; pure) and this one (the thread with its
// poll loop, heartbeats, and the calls below). Nothing the thread does waits on one peer:
// every connection has an output buffer written on POLLOUT, and a peer whose buffer passes
// kLinkOutputCap (it stopped reading) is lost like one that went silent.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/link/link_group.hpp"
#include "launch/link/link_join.hpp"
#include "launch/link/link_wire.hpp"

namespace airhost::detail {

class NodeLink {
 public:
  // The join: blocks until every node joined and agreed. Throws LaunchError when the nodes
  // disagree, node 0's port is taken or the address does not resolve (exit 2), NodeJoinError
  // when a node is missing at the deadline or `cancelled()` turns true (polled).
  static std::unique_ptr<NodeLink> join(const NodeLinkConfig& config, const std::function<bool()>& cancelled);
  ~NodeLink();  // gives what is queued 1 s in all to leave, stops the thread, closes every connection
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // Starts the heartbeats, on a thread of the link's own, which every signal the host
  // handles is blocked in (SIGINT, SIGTERM, SIGCHLD go to the host's loop, never to it).
  // `on_down` is called on that thread for each other node that fails, is stopped or lost,
  // the first time it is heard of.
  void start(std::function<void(const NodeDown&)> on_down);

  // This node is tearing its ranks down; `why` follows "node N (host) ", e.g. "failed: rank 3
  // exited with code 1". Any thread.
  // `timed_out`: it ends its ranks as a timeout does (NodeDown::timed_out), `hung` over a hang.
  void tell_down(const std::string& why, bool cascade, bool timed_out = false, bool hung = false);

  // The host's loop turns: called by it every heartbeat or so while it supervises ranks (any
  // thread). From the first call until unwatch_loop(), a loop that stops turning for
  // node_timeout (an embedding program's callback that never returns, a log write on a hung
  // file system) stops this node's heartbeats: the link tells the other nodes this node is
  // down and why, and reports it to on_down here too, so the run ends by the contract
  // everywhere rather than the others waiting on ranks nobody watches.
  void loop_alive() noexcept;
  // The loop is done supervising (the attempt is over): its silence means nothing now.
  void unwatch_loop() noexcept;

  // The most telling report heard so far: the first that is not a cascade, else the first.
  std::optional<NodeDown> down() const;

  // Waits up to `limit` for a report that is not a cascade, or until no node is left that
  // could still send one; returns down().
  std::optional<NodeDown> wait_down(std::chrono::milliseconds limit);

  // This node stopped its ranks because another node's failed: waits (up to `limit`) until the
  // nodes it follows have ended (GroupState::followed_nodes_gone), so that this node's exit
  // (138) does not make a scheduler kill the failing node before it wrote its record
  // (srun --kill-on-bad-exit). Returns at once on the failing node itself.
  void wait_followed_nodes(std::chrono::milliseconds limit);

  // This node's ranks all succeeded: waits (up to `limit`, 0 = no limit) until every node
  // finished. nullopt when they all did; else what happened instead.
  std::optional<NodeDown> finish(std::chrono::milliseconds limit);

  // After a failed attempt (this node's ranks are all stopped): tells node 0, with
  // `want_restart` when this node may start again (restarts are left; it was neither
  // interrupted nor timed out), and waits (up to `limit`, 0 = no limit) for node 0's decision
  // for every node. True: every node starts its ranks again, as attempt(); false: the job
  // ends (a node did not want it, or is gone for good), and down() says why. Node 0 waits up
  // to join_timeout for a lost node to come back when every other node wants a restart.
  // `cancelled` (polled): this node was interrupted meanwhile; it withdraws, and the job ends.
  // `leave` (an elastic job's node whose own ranks failed past max_restarts, want_restart false):
  // the group may go on without this node; it hears the job end for it (false) either way.
  bool after_attempt(bool want_restart, std::chrono::milliseconds limit, const std::function<bool()>& cancelled = {},
                     bool leave = false);
  // The attempt under way, the same on every node (TORCHELASTIC_RESTART_COUNT).
  int attempt() const;
  // How many times the link's thread has woken so far: what the link costs at rest, which for
  // node 0 of many nodes must not grow with the heartbeats it hears (one turn per 10 ms at most).
  std::uint64_t turns() const;

  // Stacks across nodes (stacks_service.hpp). Set before start(); called on the link's thread.
  // Another node hears node 0 ask: on_ask(seq, only), `only` the ranks asked, comma-separated
  // ("" for all). Node 0 hears a node's answer: on_answer(node, seq, ranks), `ranks` as
  // encode_rank_stacks() makes it.
  struct StacksHandlers {
    std::function<void(unsigned seq, const std::string& only)> on_ask;
    std::function<void(int node, unsigned seq, const std::string& ranks)> on_answer;
  };
  void handle_stacks(StacksHandlers handlers);
  // Node 0: asks every other node (any thread).
  void ask_stacks(unsigned seq, const std::string& only);
  // Another node: answers node 0 (any thread).
  void answer_stacks(unsigned seq, const std::string& ranks);

  // This node's rank and the number of nodes of the group it joined: those given, or an elastic
  // job's as node 0 numbered the nodes that came (--nnodes MIN:MAX).
  int node_rank() const;
  int nnodes() const;
  // Where rank 0's store listens: 0 for master_port (a fixed count); an elastic job's own port,
  // chosen by node 0, the same for every attempt.
  int store_port() const;
  // Every node of the group as messages name them, "node 1 (gpu-b, 10.0.0.2)", by rank: node 0
  // knows them all; another node, node 0 and itself.
  std::vector<std::string> node_names() const;

  // Every node, by node rank (this one's address empty), once joined.
  const std::vector<NodeHello>& nodes() const;

  struct Impl;  // node_link.cpp

 private:
  explicit NodeLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost::detail
