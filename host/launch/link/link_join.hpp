// link_join.hpp — how the hosts of a multi-node run find each other (node_link.hpp tells the
// protocol): node 0 listens on the master port, the other nodes connect and say hello; node 0
// checks that they agree and answers each with a welcome, or every one with the same refusal.
// Blocking, before any rank starts and before the link's thread exists.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/link/link_wire.hpp"

struct pollfd;

namespace airhost::detail {

struct NodeLinkConfig {
  int node_rank = 0;
  int nnodes = 1;       // an elastic job: MAX
  int nnodes_min = 0;   // an elastic job (--nnodes MIN:MAX): MIN; 0: exactly nnodes. node_rank -1: node 0 numbers this one
  std::chrono::milliseconds join_settle{3000};  // elastic: node 0 starts the job once MIN joined and none came for this long
  std::chrono::milliseconds scale_up_interval{60000};  // elastic: the least time between two restarts that take nodes in
  // An elastic job's node 0: the port of rank 0's store, which is not master_port (node 0's
  // airhost keeps listening there for nodes that come while the job runs). Sent to every node
  // with its welcome. 0: master_port, as for a fixed count.
  int store_port = 0;
  int nprocs = 1;
  int max_restarts = 0;                   // every node must be given the same (checked at the join)
  std::string master_addr;               // node 0's address, as the ranks get it
  int master_port = 0;                   // where node 0's airhost listens, then rank 0's store
  std::chrono::milliseconds node_timeout{30000};  // silence after which a node is lost
  std::chrono::milliseconds join_timeout{600000}; // how long the join may take
  // Every how often a node says it is alive; 0: node_timeout / 3, between 0.1 and 1 s, so
  // that two heartbeats can go missing before a node is taken for silent.
  std::chrono::milliseconds heartbeat{0};
  // Where progress lines go ("node 1 of 2: waiting for node 0 at ..."), without "airhost: " or
  // '\n'; empty: nowhere. The launcher's goes to the host log and, never blocking, to stderr.
  std::function<void(const std::string& line)> say;
  // The job's join token (link_auth.hpp): node 0 admits only nodes that prove they hold it,
  // and a node joins only a node 0 that proves it too. Empty: the join is open, as before.
  std::string join_token;
  // Node 0: a file it sends to every node once it exists (looked for every heartbeat), once;
  // the other nodes: where what node 0 sent is written (atomically). The CLI's MLflow run of a
  // several-node launch (tracking.env), made on node 0 and bound by every node's ranks. At most
  // 16 KiB. Empty: none.
  std::string shared_file;
};

// A node did not join within join_timeout (or node 0 never answered): exit 138, node_lost.
class NodeJoinError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Node 0's verdict on the nodes that joined so far (`self` is node 0, `peers` the others in
// the order they joined): empty when they agree, else one sentence naming the nodes that
// disagree, what each said and what to change.
std::string check_nodes(const NodeHello& self, const std::vector<NodeHello>& peers);

// "a", "a and b", "a, b and c": how messages list nodes.
std::string join_list(const std::vector<std::string>& items);

// The master address as getaddrinfo() sees it: empty when it resolves (or the failure is
// temporary: the join retries), else why not ("Name or service not known").
std::string resolve_problem(const std::string& host);

// A node at the other end of a connection.
struct LinkPeer {
  NodeHello node;       // who it is (node 0 fills in its address)
  LinkConnection conn;  // owns the socket; node 0's welcome may still be in its buffer
};

// What a join leaves: every node's hello by node rank (this node's address empty), and the
// connections: node 0 has one per other node, in node rank order; another node one, to node 0.
struct JoinedGroup {
  std::vector<NodeHello> nodes;
  std::vector<LinkPeer> peers;
  int nnodes = 0;      // the nodes in the group (an elastic job: those that came, MIN to MAX)
  int store_port = 0;  // where rank 0's store listens (an elastic job's: node 0's choice); 0: master_port
  int node_rank = -1;  // this node's rank in it (an elastic job: as node 0 numbered the nodes)
  int attempt = 0;  // a node that came back to a job: the attempt every node starts next
};

// Node 0 between two attempts, when nodes of the job were lost (their airhost killed, their pod
// restarted): listens on the master port again (rank 0's store has let it go) and admits those
// nodes when their airhost comes back, as at the join: the same checks, the same join token.
// Never blocks, but for the second a refusal may take to leave: the link's thread polls it.
class RejoinDesk {
 public:
  // Throws LaunchError when node 0 cannot listen on the port again.
  explicit RejoinDesk(const NodeLinkConfig& config);
  ~RejoinDesk();
  RejoinDesk(const RejoinDesk&) = delete;
  RejoinDesk& operator=(const RejoinDesk&) = delete;
  // Appends what to poll: the listeners and the connections on their way.
  void add_poll_fds(std::vector<struct pollfd>& fds) const;
  // Takes what came: the nodes admitted, each one of `wanted` (node ranks), its hello checked
  // against node 0's. Anyone else is refused, with one line through config.say.
  std::vector<LinkPeer> take(const std::vector<int>& wanted);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Blocks until every node joined and agreed. Throws LaunchError when the nodes disagree, node
// 0's port is taken or the address does not resolve (exit 2), NodeJoinError when a node is
// missing at the deadline or `cancelled()` turns true (polled).
JoinedGroup join_group(const NodeLinkConfig& config, const std::function<bool()>& cancelled);

}  // namespace airhost::detail
