#include "launch/run/port.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <system_error>
#include <utility>

namespace airhost::detail {
namespace {

int reusable_socket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  return fd;
}

// The flock that says "an airhost run uses this port"; -1 when another run holds it.
int lock_port(int port) {
  const char* dir = "/tmp/airhost-ports";
  if (::mkdir(dir, 01777) == 0) ::chmod(dir, 01777);  // shared by every user, like /tmp
  const std::string path = std::string(dir) + "/" + std::to_string(port) + ".lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return -2;  // cannot lock at all: fall back to the socket alone
  ::fchmod(fd, 0666);
  if (::flock(fd, LOCK_EX | LOCK_NB) < 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

PortReservation PortReservation::reserve(int port) {
  // A free port another airhost run happens to hold too is skipped: ask again.
  for (int attempt = 0;; ++attempt) {
    PortReservation r = reserve_once(port);
    if (r.lock_fd_ != -1 || r.port_ == 0) return r;
    if (port != 0)
      throw std::system_error(EADDRINUSE, std::generic_category(),
                              "master port " + std::to_string(port) + " is in use by another airhost run");
    if (attempt == 50) throw std::system_error(EADDRINUSE, std::generic_category(), "cannot reserve a free port");
  }
}

PortReservation PortReservation::reserve_once(int port) {
  PortReservation r;
  // IPv4 wildcard first: that is where the kernel picks the port number.
  r.fd4_ = reusable_socket(AF_INET);
  if (r.fd4_ < 0) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in a4{};
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  a4.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(r.fd4_, reinterpret_cast<sockaddr*>(&a4), sizeof a4) < 0)
    throw std::system_error(errno, std::generic_category(),
                            port ? "cannot reserve master port " + std::to_string(port) : "cannot reserve a free port");
  socklen_t len = sizeof a4;
  ::getsockname(r.fd4_, reinterpret_cast<sockaddr*>(&a4), &len);
  r.port_ = ntohs(a4.sin_port);

  // The IPv6 wildcard too (v6-only, so it does not clash with the v4 socket): a store
  // that binds [::] is then protected as well. A host without IPv6 just skips it.
  r.fd6_ = reusable_socket(AF_INET6);
  if (r.fd6_ >= 0) {
    int on = 1;
    ::setsockopt(r.fd6_, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    sockaddr_in6 a6{};
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons(static_cast<uint16_t>(r.port_));
    if (::bind(r.fd6_, reinterpret_cast<sockaddr*>(&a6), sizeof a6) < 0) {
      ::close(r.fd6_);
      r.fd6_ = -1;
    }
  }
  r.lock_fd_ = lock_port(r.port_);
  if (r.lock_fd_ == -1) r.release();  // held by another run; the caller decides
  else if (r.lock_fd_ == -2) r.lock_fd_ = -3;  // unlockable: not -1, so the socket alone counts
  return r;
}

PortReservation::~PortReservation() { release(); }

PortReservation::PortReservation(PortReservation&& o) noexcept
    : fd4_(std::exchange(o.fd4_, -1)),
      fd6_(std::exchange(o.fd6_, -1)),
      lock_fd_(std::exchange(o.lock_fd_, -1)),
      port_(std::exchange(o.port_, 0)) {}

PortReservation& PortReservation::operator=(PortReservation&& o) noexcept {
  if (this != &o) {
    release();
    fd4_ = std::exchange(o.fd4_, -1);
    fd6_ = std::exchange(o.fd6_, -1);
    lock_fd_ = std::exchange(o.lock_fd_, -1);
    port_ = std::exchange(o.port_, 0);
  }
  return *this;
}

void PortReservation::release() noexcept {
  if (fd4_ >= 0) ::close(fd4_);
  if (fd6_ >= 0) ::close(fd6_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
  fd4_ = fd6_ = lock_fd_ = -1;
}

}  // namespace airhost::detail
