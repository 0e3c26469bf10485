// link_wire.hpp — the node link's wire: its frame kinds, the hello codec, and a buffered,
// non-blocking connection to one peer (node_link.hpp tells the protocol).
//
// Frames are frames.hpp's (magic, kind, length), decoded by its FrameDecoder with a length
// cap, with payloads of encode_fields(); the kinds below are this link's own.
//
// A LinkConnection never makes its caller wait on the peer: a frame is appended whole to the
// connection's output buffer (or refused whole when the buffer would pass its cap) and the
// buffer is written as far as the socket takes it, the rest when poll() says POLLOUT. So no
// frame is ever sent in part, and a peer that stops reading costs at most the cap in memory
// before its caller declares it lost, instead of stalling the one thread that serves every peer.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/rank/frames.hpp"

namespace airhost::detail {

// The node link's protocol, raised with every change a node of the previous version would
// misread or drop: node 0 refuses a node of another version at the join, naming both.
//   1  join, agreement, heartbeats, down reports, the exit barrier
//   2  the stacks frames (node 0 asking the other nodes) and the down report's new fields
constexpr int kNodeLinkVersion = 2;

enum class LinkKind : std::uint16_t {
  hello = 1,      // node → node 0: NodeHello
  welcome = 2,    // node 0 → node: every node joined and agrees; fields host, nodes, attempt (a node
                  // that came back between two attempts starts at the next one; absent: 0)
  refuse = 3,     // node 0 → node: fields message, kind ("join" or "usage")
  heartbeat = 4,  // both ways, no payload
  down = 5,       // either way, relayed by node 0: fields node, message, cascade, attempt
  done = 6,       // node → node 0: this node's ranks all succeeded; field attempt
  end = 7,        // node 0 → node: every node is done; field attempt
  challenge = 8,  // node 0 → node, with a join token: fields nonce, proof (link_auth.hpp)
  proof = 9,      // node → node 0, with a join token: field proof
  stopped = 10,   // node → node 0: its ranks of a failed attempt are stopped; fields attempt, restart ("1": it may start again)
  restart = 11,   // node 0 → node: every node starts its ranks again; field attempt (the new one)
  final = 12,     // node 0 → node: no restart after that failed attempt; field attempt
  file = 13,      // node 0 → node: NodeLinkConfig::shared_file, once it exists; field text
  heard = 14,     // node 0 → node, on an open join: its hello was taken, the welcome comes when every
                  // node is there. A node that hears nothing at all after its hello (a challenge, this,
                  // a refusal) has reached something else on the port, e.g. rank 0's store of an
                  // attempt under way, and tries again.
  stacks_ask = 15,  // node 0 → node: `airhost stacks` or the hang watch on node 0 wants this node's
                    // ranks' stacks; fields seq, only (ranks, comma-separated; absent: all)
  stacks = 16,      // node → node 0: the answer; fields seq, node, ranks (encode_rank_stacks)
};

// The largest link frame: a node's answer with its ranks' stacks (kStacksAnswerCap, a few
// KiB per rank in practice) and a little more; every other frame is under a KiB or two. A
// larger length means the peer is not an airhost, or the stream is corrupted.
constexpr std::size_t kMaxLinkFrame = 1024 * 1024;
constexpr std::size_t kStacksAnswerCap = kMaxLinkFrame - 4096;
// The largest frame a connection may send before it has joined: a hello or a proof is a few
// hundred bytes (a host name is at most 255).
constexpr std::size_t kMaxJoinFrame = 4096;

// What a node says about itself when it joins.
struct NodeHello {
  int version = kNodeLinkVersion;
  int node_rank = 0;
  int nnodes = 1;      // an elastic job: MAX
  int nnodes_min = 0;  // an elastic job (--nnodes MIN:MAX): MIN; 0: exactly nnodes. node_rank -1: node 0 numbers it
  int nprocs = 1;      // ranks on that node
  int max_restarts = 0;  // restarts of the whole group it was given (every node must agree)
  std::string host;    // its host name
  std::string address; // where node 0 saw it connect from (not sent; filled by node 0)
  std::string nonce;   // a node holding a join token: its fresh nonce (link_auth.hpp); else empty
};

std::string encode_hello(const NodeHello& hello);
// Throws FrameError (frames.hpp) when the payload is not a hello of any version.
NodeHello decode_hello(std::string_view payload);

// "node 1 (gpu-b, 10.0.0.2)": how messages name a node.
std::string describe_node(const NodeHello& node);

// One whole link frame: header and fields.
std::string link_frame(LinkKind kind, const Fields& fields = {});
// A frame of `kind` around a payload already encoded (link_messages.hpp).
std::string message_frame(LinkKind kind, const std::string& payload);

// Every connection's output cap. Link traffic is a heartbeat (16 bytes) a second, a few
// reports of under a KiB each and, when someone asks, one answer of stacks per node, so a
// peer that reads at all never has more than one answer waiting here. 4 MiB is four of the
// largest frame allowed, and what days of heartbeats would pile up, so only a peer that has
// stopped reading ever reaches it; and it bounds node 0's memory at 4 MiB per node however
// many nodes stall at once.
constexpr std::size_t kLinkOutputCap = 4 * 1024 * 1024;

// What a socket operation found.
enum class LinkIo {
  ok,      // done, or nothing to do yet (would block)
  full,    // send(): the frame would pass the output cap; nothing of it was queued
  closed,  // the peer's end is gone (EOF, reset, broken pipe) or the socket failed
};

// A field's integer ("42"), or `fallback` when it is not one: what a peer sends is never
// trusted to parse.
int field_int(const std::string& text, int fallback);

// One TCP (or, in tests, Unix) stream socket to a peer, non-blocking, with an output buffer
// and a frame decoder. Movable, not copyable: it owns its descriptor and closes it (abruptly)
// when destroyed; close_gently() is the goodbye that keeps what was sent.
class LinkConnection {
 public:
  LinkConnection() = default;
  // Adopts `fd` (closed by this object from here on, even when this throws), makes it
  // non-blocking and sets TCP_NODELAY where it is TCP. Throws std::system_error when the
  // descriptor cannot be made non-blocking.
  explicit LinkConnection(int fd, std::size_t output_cap = kLinkOutputCap);
  ~LinkConnection();
  LinkConnection(LinkConnection&& other) noexcept;
  LinkConnection& operator=(LinkConnection&& other) noexcept;
  LinkConnection(const LinkConnection&) = delete;
  LinkConnection& operator=(const LinkConnection&) = delete;

  int fd() const noexcept { return fd_; }
  bool is_open() const noexcept { return fd_ >= 0; }

  // Queues one whole frame, then writes what the socket takes now. `full` when the bytes
  // waiting plus this frame would pass the cap: the frame is not queued, the peer is not
  // reading and its caller declares it lost. `closed` when the write failed (the peer's end
  // is gone): the output is dropped; what the peer sent before may still be read.
  LinkIo send(std::string_view frame);
  // Writes what the socket takes of the output buffer now (on POLLOUT).
  LinkIo flush();
  // Bytes queued that the socket has not taken yet.
  std::size_t output_pending() const noexcept { return out_.size() - out_sent_; }
  // The events to poll for: POLLIN, and POLLOUT while output waits.
  short poll_events() const noexcept;

  // Reads what has arrived (a bounded amount per call: poll is level-triggered, so the rest
  // comes next turn), into the decoder. `closed` at EOF or on an error; frames read before
  // it are still there to take with next_frame().
  LinkIo receive();
  // Bytes read so far, in all: a peer is heard whenever this grows.
  std::uint64_t bytes_received() const noexcept { return received_; }
  // A whole frame read, if there is one. Throws FrameError when the bytes are not link frames
  // (bad magic, or a length over kMaxLinkFrame): the peer is then not to be trusted.
  std::optional<Frame> next_frame() { return decoder_.next(); }
  // The largest frame this peer may announce (kMaxLinkFrame unless lowered): a connection not
  // yet authenticated gets no more than a hello needs, so that a 16-byte header from anyone
  // cannot make node 0 reserve a megabyte for it.
  void limit_frames(std::size_t max_payload) { decoder_.set_max_length(max_payload); }

  // Closes the descriptor now; unsent output is dropped.
  void close() noexcept;
  // Ends the connection keeping what was sent: no more output (FIN after what the kernel
  // holds), then the unread input is drained, since closing a socket with unread input sends
  // a reset, and a reset can make the peer drop our last frames unread. Output still in this
  // object's buffer is dropped: flush_all() first for a last chance.
  void close_gently() noexcept;

 private:
  int fd_ = -1;
  std::size_t cap_ = kLinkOutputCap;
  std::string out_;           // queued frames, whole; out_sent_ bytes of it already written
  std::size_t out_sent_ = 0;
  std::uint64_t received_ = 0;
  FrameDecoder decoder_{"node link", kMaxLinkFrame};
};

// Gives the connections' queued output until `deadline` to be written, all at once (one poll
// over all of them, not a wait per connection). For goodbyes only: a refusal, the last report
// before this node exits. Connections whose peer turns out gone are skipped.
void flush_all(const std::vector<LinkConnection*>& connections, std::chrono::steady_clock::time_point deadline);

}  // namespace airhost::detail
