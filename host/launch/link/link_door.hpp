// link_door.hpp — node 0's door: the connections that have not joined yet. Each is accepted
// within bounds (how many wait, how many from one address, how large a frame may be), read up to
// its hello (and, with a join token, its proof), then admitted or refused with one line; strangers
// are named a few at a time. join_as_hub (link_join.cpp) keeps it open while the nodes join, and
// RejoinDesk (link_join.hpp) while an elastic job runs or lost nodes come back.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "launch/link/link_join.hpp"
#include "launch/link/link_wire.hpp"

namespace airhost::detail {

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
// How long a refusal may take to leave, all connections together, before node 0 gives up.
constexpr auto kGoodbyeWait = std::chrono::seconds(1);

// "node K of N: LINE" (or "a node of MIN:MAX" before node 0 numbers it), through cfg.say.
void link_say(const NodeLinkConfig& cfg, const std::string& line);
// This node's hello, as its config says (link_join.cpp).
NodeHello self_hello(const NodeLinkConfig& cfg);
// The peer's numeric address ("10.0.0.2", an IPv4-mapped one as IPv4), "?" if none.
std::string peer_address(const sockaddr_storage& sa);

// What node 0 says of strangers on its port (a scanner, a health check, a flood of junk, a
// node with the wrong token): the first kStrangerLines of each kStrangerWindow one by one, the
// rest counted and said in one line once the window is over, so that a flood neither fills
// the log nor costs the join its time.
constexpr int kStrangerLines = 5;
constexpr auto kStrangerWindow = std::chrono::seconds(10);

class StrangerLines {
 public:
  void say(const NodeLinkConfig& cfg, const std::string& line);
  // The count of a window that is over; with `now`, of this one too (the join is done).
  void tick(const NodeLinkConfig& cfg, bool now = false);
  // One more connection dropped unheard (made room for): counted in the window's line.
  void count_unsaid() { ++hidden_; }

 private:
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  int said_ = 0;
  long hidden_ = 0;
};

// A connection accepted by node 0 that has not joined yet: no hello yet, or (with a join
// token) a hello whose proof has not come yet.
struct Pending {
  LinkConnection conn;
  std::string address;
  std::chrono::steady_clock::time_point since;
  std::optional<NodeHello> hello;  // said, and challenged: the proof is awaited
  std::string hello_payload;       // as it came, for the proof
  std::string hub_nonce;           // this connection's challenge
};

// One node on a pending connection is refused: it hears why, and leaves.
void refuse_one(Pending& p, const std::string& message);
// Sends `frame` (if any) to each connection and closes them all, giving the frames kGoodbyeWait
// in all to leave.
void say_goodbye(std::vector<LinkConnection*> conns, const std::string& frame);
// Accepts what waits on the listener `l` (kAcceptPerTurn at most), within kMaxPending and
// kMaxPendingPerAddress: the oldest silent connection makes room (closed, left in `pending`
// for prune_pending). EMFILE sheds the connection instead of leaving it in the backlog.
void accept_all(int l, std::vector<Pending>& pending, StrangerLines* strangers = nullptr);
// Drops the connections made room for, before a turn indexes them.
void prune_pending(std::vector<Pending>& pending);
std::string token_on_node_only(const NodeHello& h);

// What a pending connection came to, once what it sent is read.
enum class Arrival {
  waiting,            // nothing whole yet, or its proof is awaited
  admitted,           // p.hello holds who it is, checked against the token if there is one
  dropped,            // refused (said here, and told to it) or not a node at all; p.conn may be closed
  token_on_node_only, // it holds a token and node 0 none: p.hello says who
};

// Reads what `p` sent and takes its join one step on (hello, challenge, proof); a stranger is
// dropped with one line naming where it came from (advance's comment in link_door.cpp).
Arrival advance(const NodeLinkConfig& cfg, Pending& p, StrangerLines& strangers);
// The nodes disagree: the nodes still on their way (up to `missing`, for a few seconds) get the
// same refusal before node 0 gives up.
void refuse_late_joiners(int l4, int l6, std::vector<Pending>& pending, const std::string& message, int missing);
// A listening socket on `port` of every address of `family`, or -1 with `error` said.
int listen_on(int family, int port, std::string& error);

}  // namespace airhost::detail
