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
//            node_timeout (cut off, frozen), is lost. A node that tears down its ranks (a rank
//            failed, a timeout, a signal) says so first. Node 0 relays what it hears, so
//            every node learns of every other: the star has node 0 at its centre.
//   finish   a node whose ranks all succeeded says "done" and waits until node 0 has heard
//            it from every node, so that no airhost ends while another node's ranks still
//            need the others (an exit barrier, as torchrun's agents have).
//
// Frames are frames.hpp's (magic, kind, length) with payloads of encode_fields(), so the
// codec is the control channel's; the kinds below are this link's own.
#pragma once

#include <cstdint>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace airhost::detail {

constexpr int kNodeLinkVersion = 1;

enum class LinkKind : std::uint16_t {
  hello = 1,      // node → node 0: NodeHello
  welcome = 2,    // node 0 → node: every node joined and agrees; fields host, nodes
  refuse = 3,     // node 0 → node: fields message (the nodes disagree); exit 2
  heartbeat = 4,  // both ways, no payload
  down = 5,       // either way, relayed by node 0: fields node, message, cascade
  done = 6,       // node → node 0: this node's ranks all succeeded
  end = 7,        // node 0 → node: every node is done; exit
};

// What a node says about itself when it joins.
struct NodeHello {
  int version = kNodeLinkVersion;
  int node_rank = 0;
  int nnodes = 1;
  int nprocs = 1;      // ranks on that node
  std::string host;    // its host name
  std::string address; // where node 0 saw it connect from (not sent; filled by node 0)
};

std::string encode_hello(const NodeHello& hello);
// Throws FrameError (frames.hpp) when the payload is not a hello of any version.
NodeHello decode_hello(std::string_view payload);

// "node 1 (gpu-b, 10.0.0.2)": how messages name a node.
std::string describe_node(const NodeHello& node);

// Node 0's verdict on the nodes that joined so far (`self` is node 0, `peers` the others in
// the order they joined): empty when they agree, else one sentence naming the nodes that
// disagree, what each said and what to change.
std::string check_nodes(const NodeHello& self, const std::vector<NodeHello>& peers);

struct NodeLinkConfig {
  int node_rank = 0;
  int nnodes = 1;
  int nprocs = 1;
  std::string master_addr;               // node 0's address, as the ranks get it
  int master_port = 0;                   // where node 0's airhost listens, then rank 0's store
  std::chrono::milliseconds node_timeout{30000};  // silence after which a node is lost
  std::chrono::milliseconds join_timeout{600000}; // how long the join may take
  std::chrono::milliseconds heartbeat{1000};      // 0 = min(1 s, node_timeout / 3)
  bool say = true;                        // progress lines ("waiting for node 0") on stderr
};

// A node joined, then failed, was stopped or was lost.
struct NodeDown {
  int node = -1;
  std::string message;   // whole sentence: "node 1 (gpu-b, 10.0.0.2) was lost: ..."
  bool cascade = false;  // that node only failed because one of its ranks lost a peer
};

// A node did not join within join_timeout (or node 0 never answered): exit 138, node_lost.
class NodeJoinError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The master address as getaddrinfo() sees it: empty when it resolves (or the failure is
// temporary: the join retries), else why not ("Name or service not known").
std::string resolve_problem(const std::string& host);

class NodeLink {
 public:
  // The join: blocks until every node joined and agreed. Throws LaunchError when the nodes
  // disagree, node 0's port is taken or the address does not resolve (exit 2), NodeJoinError
  // when a node is missing at the deadline or `cancelled()` turns true (polled).
  static std::unique_ptr<NodeLink> join(const NodeLinkConfig& config, const std::function<bool()>& cancelled);
  ~NodeLink();  // sends what is queued, closes every connection, stops the thread
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // Starts the heartbeats, on a thread of the link's own. `on_down` is called on that thread
  // for each other node that fails, is stopped or lost, the first time it is heard of.
  void start(std::function<void(const NodeDown&)> on_down);

  // This node is tearing its ranks down; `why` follows "node N (host) ", e.g. "failed: rank 3
  // exited with code 1". Any thread.
  void tell_down(const std::string& why, bool cascade);

  // The most telling report heard so far: the first that is not a cascade, else the first.
  std::optional<NodeDown> down() const;

  // Waits up to `limit` for a report that is not a cascade, or until no node is left that
  // could still send one; returns down().
  std::optional<NodeDown> wait_down(std::chrono::milliseconds limit);

  // This node's ranks all succeeded: waits (up to `limit`, 0 = no limit) until every node
  // finished. nullopt when they all did; else what happened instead.
  std::optional<NodeDown> finish(std::chrono::milliseconds limit);

  // Every node, by node rank (this one's address empty), once joined.
  const std::vector<NodeHello>& nodes() const;

  struct Impl;  // node_link.cpp

 private:
  explicit NodeLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost::detail
