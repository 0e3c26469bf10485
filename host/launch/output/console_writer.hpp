// console_writer.hpp — the host's output to its own stdout and stderr, never blocking the loop.
//
// A terminal paused with Ctrl-S, a pipe nobody reads (`airhost train.py | slow`), a stuck tee:
// a blocking write there used to freeze the supervisor's loop, and with it the timeout,
// signals, reaping and the teardown of a failed run. Now the loop only queues bytes here; a
// thread of its own writes them out when the descriptor can take them (poll for POLLOUT, then
// at most what is known to fit). The queue has a cap: past it, whole chunks are skipped and
// counted, and once the reader catches up one line says how much it missed and where all of
// it is (the logs always take every byte). Ranks are never blocked by the reader, and the host
// never grows without bound.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace airhost::detail {

class ConsoleWriter {
 public:
  // Writes to `fd` (not owned). `cap`: bytes the queue may hold before output is skipped.
  // `where`: what the skip note points to ("the logs in /run/dir/logs").
  ConsoleWriter(int fd, std::size_t cap, std::string where);
  ~ConsoleWriter();  // drain(0): whatever the reader has not taken by then is dropped
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // Queues `bytes`; never blocks. Over the cap they are skipped (and counted); a chunk larger
  // than the cap is taken when the queue is empty.
  void write(std::string_view bytes);
  // Waits until every queued byte is written, or `timeout` passed with the reader taking
  // nothing. True when all was written.
  bool drain(std::chrono::milliseconds timeout);

  std::uint64_t skipped_bytes() const;  // so far, in all
  // The queue is at its cap and the reader is taking it, only slower than it comes: the host
  // should stop reading the ranks for a while, so that they wait on their full pipes as under
  // plain `python` (nothing is lost). False once the reader is stalled: then output is skipped.
  bool behind() const;
  // Stops the writer: what the reader cannot take at once is dropped. Returns every byte it
  // never wrote (skipped, or dropped now). write() queues nothing after it.
  std::uint64_t close();

  static constexpr std::size_t kDefaultCap = 8u << 20;
  // A reader that took nothing for this long, with the queue past its cap, is stalled.
  // Long enough that a reader cut off the CPU on a busy machine is not taken for a stalled
  // one; short enough that ranks held back by behind() wait no longer than that on one.
  static constexpr auto kStalledAfter = std::chrono::milliseconds(1000);

 private:
  void run();
  // Under mutex_: one line of its own saying how much was skipped since the last one.
  void queue_skip_note();
  bool wait_writable(int timeout_ms) const;

  const int fd_;
  const std::size_t cap_;
  const std::string where_;
  std::size_t max_write_ = 0;  // what one write may carry without blocking (console_writer.cpp)
  bool socket_ = false;        // then written with MSG_DONTWAIT
  mutable std::mutex mutex_;
  std::condition_variable wake_, drained_;
  std::deque<std::string> queue_;
  std::size_t queued_ = 0;
  std::size_t front_offset_ = 0;    // bytes of queue_.front() already written
  std::uint64_t skipped_now_ = 0;   // skipped since the last note
  std::uint64_t skipped_total_ = 0;
  std::uint64_t dropped_ = 0;       // queued, then given up on (the reader never came back)
  bool last_was_newline_ = true;    // of what was queued: a note starts a line of its own
  bool stopping_ = false;
  bool broken_ = false;
  std::chrono::steady_clock::time_point last_progress_;  // the reader last took bytes (or had none to take)             // the reader is gone for good: nothing more is queued
  bool writing_ = false;            // the thread holds bytes it is writing
  std::thread thread_;
};

}  // namespace airhost::detail
