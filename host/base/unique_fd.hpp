// unique_fd.hpp — one owned file descriptor, closed when its owner goes.
//
// For the start path of a rank, where several pipes and sockets are made one after another:
// when the third fails (EMFILE), the first two must not leak. Movable, not copyable;
// release() hands the descriptor to its next owner (a libuv handle, a child process).
#pragma once

#include <unistd.h>

#include <utility>

namespace airhost::detail {

class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  // The descriptor, no longer ours to close.
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace airhost::detail
