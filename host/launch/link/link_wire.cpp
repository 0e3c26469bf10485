// link_wire.cpp — see link_wire.hpp.
#include "launch/link/link_wire.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

namespace airhost::detail {
namespace {

// Reads per receive(): a peer that floods gets the next turn.
constexpr std::size_t kReadPerTurn = 256 * 1024;

}  // namespace

int field_int(const std::string& s, int fallback) {
  try {
    return std::stoi(s);
  } catch (...) {
    return fallback;
  }
}

// ---- the hello ------------------------------------------------------------------------------

std::string encode_hello(const NodeHello& h) {
  return encode_fields({{"version", std::to_string(h.version)},
                        {"node_rank", std::to_string(h.node_rank)},
                        {"nnodes", std::to_string(h.nnodes)},
                        {"nnodes_min", std::to_string(h.nnodes_min)},
                        {"nprocs", std::to_string(h.nprocs)},
                        {"max_restarts", std::to_string(h.max_restarts)},
                        {"host", h.host},
                        {"nonce", h.nonce}});
}

NodeHello decode_hello(std::string_view payload) {
  auto f = decode_fields(payload);
  if (!f.count("version") || !f.count("node_rank"))
    throw FrameError("a node link hello needs at least a version and a node rank");
  NodeHello h;
  h.version = field_int(f["version"], -1);
  h.node_rank = field_int(f["node_rank"], -1);
  h.nnodes = field_int(f["nnodes"], -1);
  h.nnodes_min = field_int(f["nnodes_min"], 0);  // absent: a fixed count (an airhost before elastic jobs)
  h.nprocs = field_int(f["nprocs"], -1);
  h.max_restarts = field_int(f["max_restarts"], 0);
  h.host = f["host"].empty() ? "unknown" : f["host"];
  h.nonce = f["nonce"];
  return h;
}

std::string describe_node(const NodeHello& n) {
  std::string s = (n.node_rank < 0 ? std::string("a node") : "node " + std::to_string(n.node_rank)) + " (" + n.host;
  if (!n.address.empty() && n.address != n.host) s += ", " + n.address;
  return s + ")";
}

std::string link_frame(LinkKind kind, const Fields& fields) {
  return encode_frame(static_cast<std::uint16_t>(kind), encode_fields(fields));
}

std::string message_frame(LinkKind kind, const std::string& payload) {
  return encode_frame(static_cast<std::uint16_t>(kind), payload);
}

// ---- the connection -------------------------------------------------------------------------

LinkConnection::LinkConnection(int fd, std::size_t output_cap) : fd_(fd), cap_(output_cap) {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) {
    const int err = errno;
    close();  // adopted: ours to close even though construction fails
    throw std::system_error(err, std::generic_category(), "making a node link socket non-blocking");
  }
  // Frames are small and each one matters now (a report, a heartbeat): no Nagle delay. Fails
  // harmlessly (ENOTSUP) on the Unix sockets of the tests.
  int on = 1;
  (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

LinkConnection::~LinkConnection() { close(); }

LinkConnection::LinkConnection(LinkConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      cap_(other.cap_),
      out_(std::move(other.out_)),
      out_sent_(std::exchange(other.out_sent_, 0)),
      received_(other.received_),
      decoder_(std::move(other.decoder_)) {}

LinkConnection& LinkConnection::operator=(LinkConnection&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    cap_ = other.cap_;
    out_ = std::move(other.out_);
    out_sent_ = std::exchange(other.out_sent_, 0);
    received_ = other.received_;
    decoder_ = std::move(other.decoder_);
  }
  return *this;
}

LinkIo LinkConnection::send(std::string_view frame) {
  if (fd_ < 0) return LinkIo::closed;
  if (output_pending() + frame.size() > cap_) return LinkIo::full;
  // Compact before appending: what was written is never needed again.
  if (out_sent_ > 0) {
    out_.erase(0, out_sent_);
    out_sent_ = 0;
  }
  out_.append(frame);
  return flush();
}

LinkIo LinkConnection::flush() {
  if (fd_ < 0) return LinkIo::closed;
  while (out_sent_ < out_.size()) {
    // MSG_NOSIGNAL: a peer gone is an EPIPE here, not a SIGPIPE for the whole host.
    const ssize_t n = ::send(fd_, out_.data() + out_sent_, out_.size() - out_sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_sent_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return LinkIo::ok;  // the rest on POLLOUT
    // The peer's end is gone: nothing queued can reach it any more.
    out_.clear();
    out_sent_ = 0;
    return LinkIo::closed;
  }
  out_.clear();
  out_sent_ = 0;
  return LinkIo::ok;
}

short LinkConnection::poll_events() const noexcept {
  return static_cast<short>(POLLIN | (output_pending() > 0 ? POLLOUT : 0));
}

LinkIo LinkConnection::receive() {
  if (fd_ < 0) return LinkIo::closed;
  char buf[16384];
  std::size_t taken = 0;
  while (taken < kReadPerTurn) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      decoder_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      taken += static_cast<std::size_t>(n);
      received_ += static_cast<std::uint64_t>(n);
      continue;
    }
    if (n == 0) return LinkIo::closed;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? LinkIo::ok : LinkIo::closed;
  }
  return LinkIo::ok;
}

void LinkConnection::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  out_.clear();
  out_sent_ = 0;
}

void LinkConnection::close_gently() noexcept {
  if (fd_ < 0) return;
  (void)::shutdown(fd_, SHUT_WR);  // fails only when the peer's end is gone already: then so is the point
  char sink[4096];
  for (int i = 0; i < 64; ++i) {  // bounded: a peer that keeps sending does not keep us here
    const ssize_t n = ::recv(fd_, sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    break;
  }
  close();
}

void flush_all(const std::vector<LinkConnection*>& connections, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  std::vector<pollfd> fds;
  std::vector<LinkConnection*> waiting;
  for (;;) {
    fds.clear();
    waiting.clear();
    for (LinkConnection* c : connections)
      if (c && c->is_open() && c->output_pending() > 0) {
        fds.push_back({c->fd(), POLLOUT, 0});
        waiting.push_back(c);
      }
    if (waiting.empty()) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 100)));
    if (n < 0 && errno != EINTR) return;
    for (std::size_t i = 0; i < fds.size(); ++i)
      if (fds[i].revents) {
        // A write error (POLLERR, POLLHUP) drops that connection's output, which takes it
        // off the wait; its descriptor stays for the caller's close_gently().
        (void)waiting[i]->flush();
      }
  }
}

}  // namespace airhost::detail
