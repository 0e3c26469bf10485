// console_writer.cpp — queue, cap and writer thread (console_writer.hpp).
#include "launch/output/console_writer.hpp"

#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "base/util.hpp"

namespace airhost::detail {

namespace {

// How much one write may carry once poll() said POLLOUT, so that it never blocks: a pipe then
// has PIPE_BUF free; a terminal says POLLOUT while fewer than 256 bytes wait in its buffer
// (n_tty's WAKEUP_CHARS); a socket is written with MSG_DONTWAIT whatever the size; a regular
// file does not wait on a reader.
std::size_t safe_write_size(const struct stat& st, bool known) {
  if (!known) return 4096;
  if (S_ISFIFO(st.st_mode)) return PIPE_BUF;
  if (S_ISCHR(st.st_mode)) return 256;
  return 64 * 1024;
}

struct Destination {
  std::size_t max_write;
  bool socket;
};

Destination destination_of(int fd) {
  struct stat st{};
  const bool known = ::fstat(fd, &st) == 0;
  return {safe_write_size(st, known), known && S_ISSOCK(st.st_mode)};
}

}  // namespace

ConsoleWriter::ConsoleWriter(int fd, std::size_t cap, std::string where)
    : fd_(fd), cap_(cap), where_(std::move(where)), last_progress_(std::chrono::steady_clock::now()) {
  const Destination d = destination_of(fd);
  max_write_ = d.max_write;
  socket_ = d.socket;
  // The writer must never take a signal meant for the loop (SIGINT, SIGTERM, SIGCHLD...).
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] { run(); });
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

ConsoleWriter::~ConsoleWriter() { close(); }

std::uint64_t ConsoleWriter::close() {
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) return skipped_total_ + dropped_;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();  // it waits in poll() with a short timeout, never in a write that blocks
  std::lock_guard lock(mutex_);
  broken_ = true;
  return skipped_total_ + dropped_;
}

void ConsoleWriter::write(std::string_view bytes) {
  if (bytes.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (broken_) return;
    // Over the cap, the reader is behind: its output is skipped when it has taken nothing for
    // a while (stalled), or the queue passed four times the cap (too slow to ever catch up).
    // A reader that keeps taking, if in bursts behind a fast rank, loses nothing; one line
    // longer than the cap goes out whole when the queue is empty.
    const auto now = std::chrono::steady_clock::now();
    const bool stalled = now - last_progress_ > kStalledAfter;
    if (queued_ > 0 && queued_ + bytes.size() > cap_ && (stalled || queued_ + bytes.size() > 4 * cap_)) {
      skipped_now_ += bytes.size();
      skipped_total_ += bytes.size();
      return;
    }
    if (skipped_now_) queue_skip_note();  // the reader caught up: there is room again
    if (queued_ == 0) last_progress_ = now;  // the reader had nothing to take until now
    queued_ += bytes.size();
    queue_.emplace_back(bytes);
    last_was_newline_ = bytes.back() == '\n';
  }
  wake_.notify_one();
}

void ConsoleWriter::queue_skip_note() {
  std::string note = std::string(last_was_newline_ ? "" : "\n") + "airhost: " + bytes_text(static_cast<double>(skipped_now_)) +
                     " of output skipped here: the reader did not keep up (every byte is in " + where_ + ")\n";
  queued_ += note.size();
  queue_.push_back(std::move(note));
  skipped_now_ = 0;
  last_was_newline_ = true;
}

bool ConsoleWriter::behind() const {
  std::lock_guard lock(mutex_);
  return !broken_ && queued_ >= cap_ && std::chrono::steady_clock::now() - last_progress_ <= kStalledAfter;
}

std::uint64_t ConsoleWriter::skipped_bytes() const {
  std::lock_guard lock(mutex_);
  return skipped_total_;
}

bool ConsoleWriter::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  std::size_t last = queued_;
  for (;;) {
    if (queued_ == 0 && !writing_) {
      if (skipped_now_ == 0) return true;
      queue_skip_note();  // output was skipped at the very end: the note still goes out
      wake_.notify_one();
    }
    if (!drained_.wait_for(lock, timeout, [&] { return queued_ < last || (queued_ == 0 && !writing_); })) return false;
    last = queued_;
  }
}

bool ConsoleWriter::wait_writable(int timeout_ms) const {
  pollfd p{fd_, POLLOUT, 0};
  const int n = ::poll(&p, 1, timeout_ms);
  return n > 0 && (p.revents & (POLLOUT | POLLERR | POLLHUP));
}

void ConsoleWriter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    // Write without the lock, at most what fits, only once the descriptor can take it: a
    // blocked write here would keep the destructor waiting on a reader that may never come.
    const std::string& front = queue_.front();
    const std::size_t n = std::min(max_write_, front.size() - front_offset_);
    std::string chunk = front.substr(front_offset_, n);
    writing_ = true;
    const bool stop = stopping_;
    lock.unlock();
    // poll() and write() without the lock; SIGPIPE is blocked in this thread, so a reader
    // that went away is EPIPE here, not the host's death.
    ssize_t wrote = 0;
    int err = 0;
    const bool ready = wait_writable(stop ? 0 : 100);
    if (ready) {
      wrote = socket_ ? ::send(fd_, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL)
                      : ::write(fd_, chunk.data(), chunk.size());
      if (wrote < 0) err = errno;
    }
    lock.lock();
    writing_ = false;
    const bool retry = !ready || (wrote < 0 && (err == EAGAIN || err == EINTR));
    if (retry && !stopping_) continue;
    if (retry || wrote < 0) {
      // Stopping with a reader that takes nothing, or a reader gone for good (EPIPE, EIO):
      // what is left cannot be shown; drop it, and what comes later too.
      broken_ = wrote < 0;
      dropped_ += queued_;
      queue_.clear();
      queued_ = 0;
      front_offset_ = 0;
      drained_.notify_all();
      if (stopping_) return;
      continue;
    }
    last_progress_ = std::chrono::steady_clock::now();
    front_offset_ += static_cast<std::size_t>(wrote);
    queued_ -= static_cast<std::size_t>(wrote);
    if (front_offset_ == queue_.front().size()) {
      queue_.pop_front();
      front_offset_ = 0;
    }
    drained_.notify_all();
  }
}

}  // namespace airhost::detail
