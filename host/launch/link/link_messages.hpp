// link_messages.hpp — what the frames of a joined group say, field by field (link_wire.hpp has
// the frames themselves): a node down (failed, stopped, lost, leaving, or node 0 growing the
// group), a node's ranks stopped, node 0's restart and welcome with a node's place in the group.
// Pure: encoded and decoded here, fuzzed (tests/fuzz/fuzz_link_messages.cpp), and nothing a
// peer sends is taken for a place in the group before place_fits() says it fits.
#pragma once

#include <string>
#include <string_view>

#include "launch/link/link_group.hpp"

namespace airhost::detail {

// LinkKind::down: `d` in attempt `attempt` (d.attempt is not sent: the frame's own is).
std::string encode_down(int attempt, const NodeDown& d);
// Its fields: the attempt (absent: 0, a peer before attempts) and the report. Throws FrameError
// when the payload is not a field list.
NodeDown decode_down(std::string_view payload);

// LinkKind::stopped: a node's ranks of `attempt` are stopped; whether it may start them again,
// or leaves (its ranks failed past max_restarts).
struct Stopped {
  int attempt = 0;
  bool restart = false;
  bool leave = false;
};
std::string encode_stopped(const Stopped& s);
Stopped decode_stopped(std::string_view payload);

// A node's place in a group, as node 0's restart (an elastic job's: the group's size and this
// node's new rank) or welcome (with node 0's host and the port of rank 0's store) says it.
// -1: not said.
struct Place {
  int attempt = 0;
  int nodes = -1;
  int node_rank = -1;
  std::string host;   // welcome: node 0's host name
  int store_port = 0; // welcome: rank 0's store (0: --master-port's)
};
// A restart: the new attempt, and an elastic job's group size and this node's rank in it (-1: a
// fixed count's, not said).
std::string encode_restart(int attempt, int nodes = -1, int node_rank = -1);
std::string encode_welcome(const Place& p);
Place decode_place(std::string_view payload);
// A place a node may take: a group of 2 to `max_nodes` nodes, and a rank other than node 0's
// within it.
bool place_fits(const Place& p, int max_nodes);

}  // namespace airhost::detail
