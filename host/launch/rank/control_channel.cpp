#include "launch/rank/control_channel.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace airhost::detail {
namespace {

// Descriptors one recvmsg can bring. A rank sends one per result_fd frame, and Linux stops a
// read after the message that carries descriptors, so one is all a read ever brings.
constexpr std::size_t kMaxPassedFds = 8;
constexpr int kReadsPerWake = 64;

}  // namespace

ControlChannel::~ControlChannel() {
  for (int fd : passed_fds_) ::close(fd);
}

void ControlChannel::open(uv_loop_t* loop, UniqueFd fd, std::string* buffer, Events events) {
  buffer_ = buffer;
  events_ = std::move(events);
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  if (int rc = uv_poll_init(loop, &poll_, fd.get()); rc < 0)
    throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's control channel (uv_poll_init)");
  fd_ = fd.release();
  poll_.data = this;
  open_ = true;
  const int rc = uv_poll_start(&poll_, UV_READABLE | UV_DISCONNECT, [](uv_poll_t* p, int status, int) {
    auto* self = static_cast<ControlChannel*>(p->data);
    self->events_.guarded("reading a rank's control channel", [&] { self->read(status); });
  });
  if (rc < 0) {
    close();
    throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's control channel (uv_poll_start)");
  }
}

void ControlChannel::close() {
  if (!open_) return;
  open_ = false;
  if (events_.closing) events_.closing();  // the last of its frames is in (or never will be)
  uv_poll_stop(&poll_);
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), [](uv_handle_t* h) {
    auto* self = static_cast<ControlChannel*>(h->data);
    ::close(self->fd_);  // only now: libuv must not watch a descriptor that was closed
    self->fd_ = -1;
    if (self->events_.closed) self->events_.closed();
  });
}

int ControlChannel::take_passed_fd() {
  if (passed_fds_.empty()) return -1;
  const int fd = passed_fds_.front();
  passed_fds_.pop_front();
  return fd;
}

void ControlChannel::read(int status) {
  if (status < 0) {
    close();
    return;
  }
  for (int reads = 0; reads < kReadsPerWake && open_; ++reads) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
    iovec iov{buffer_->data(), buffer_->size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close();
      return;
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        passed_fds_.push_back(fd);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) && events_.note)
      events_.note("descriptors sent on the control channel were lost (too many at once)");
    if (n == 0) {
      close();
      return;
    }
    feed(std::string_view(buffer_->data(), static_cast<std::size_t>(n)));
  }
}

void ControlChannel::feed(std::string_view bytes) {
  try {
    frames_.feed(bytes);
    while (auto f = frames_.next()) events_.frame(std::move(*f));
  } catch (const std::exception& e) {  // FrameError, or what a bad frame made throw
    events_.broken(e.what());  // first: an exited rank settles as the channel closes
    close();
  }
}

}  // namespace airhost::detail
