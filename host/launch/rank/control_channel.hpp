// control_channel.hpp — the host's end of one rank's control channel: a Unix socket pair that
// carries frames (frames.hpp: results, errors, "I watch for stacks requests") and, with a
// result_fd frame, the descriptor of a result too large for a frame.
//
// It is read here with recvmsg, watched by a uv_poll_t, because it carries descriptors:
// libuv would hand them over only as handles to accept, and they must be CLOEXEC the moment
// they arrive (MSG_CMSG_CLOEXEC), or a rank spawned meanwhile would inherit another rank's
// result. The poll is level-triggered: a bounded number of reads per wake-up keeps a rank that
// floods its channel from starving the others; the rest is read on the next turn.
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <string>

#include "base/unique_fd.hpp"
#include "launch/rank/frames.hpp"

namespace airhost::detail {

class ControlChannel {
 public:
  struct Events {
    std::function<void(Frame&&)> frame;                   // each whole frame, in order
    std::function<void(const std::string& why)> broken;   // a frame that cannot be read (the channel closes next)
    std::function<void(const std::string& text)> note;    // something lost on the way, worth a word
    std::function<void()> closing;  // EOF, an error, or close(): no frame comes after this
    std::function<void()> closed;   // the handle is closed and the descriptor with it
    // Runs a callback's body so that an exception ends the run instead of unwinding uv_run.
    std::function<void(const char* where, const std::function<void()>& body)> guarded;
  };

  ControlChannel() = default;
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Takes `fd` over (made non-blocking) and watches it; `buffer` is the reads' scratch space,
  // shared and outliving the channel. Throws (fd closed, no handle left open) when libuv
  // cannot watch it.
  void open(uv_loop_t* loop, UniqueFd fd, std::string* buffer, Events events);
  void close();
  bool is_open() const { return open_; }
  int fd() const { return fd_; }  // for requests to the rank (stacks); -1 once closed
  // The oldest descriptor received and not yet claimed by a frame; -1 when none. The caller owns it.
  int take_passed_fd();

 private:
  void read(int status);
  void feed(std::string_view bytes);

  uv_poll_t poll_{};
  int fd_ = -1;
  bool open_ = false;
  std::string* buffer_ = nullptr;
  Events events_;
  FrameDecoder frames_;
  std::deque<int> passed_fds_;  // received, not yet matched to a frame
};

}  // namespace airhost::detail
