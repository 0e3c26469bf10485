// rank_output.hpp — what the ranks print, on the supervisor's loop: every rank's stdout and
// stderr pipes, read by libuv, each through its RankStream (log_stream.hpp) into its log, the
// console (the host's terminal, through HostOutput's writers) and the caller's callbacks
// (on_output, a line at a time; on_console, the bytes as shown).
//
//   batching   what the console shows waits in Console and leaves in one write per stream
//              switch per read (flush), not one per line: a rank printing flat out costs the
//              host a few syscalls per 64 KiB. One thread writes, so lines never interleave.
//   held lines a partial line is held kQuietMs for its end before it is shown (LiveSplitter);
//              the output timer wakes the loop when the first is due.
//   back-pressure  a console reader slower than the ranks (a pipe into a busy program, a slow
//              terminal) holds the ranks back, as under plain `python`: reading stops while
//              a writer is behind() and starts again when it has room (or when the reader
//              stalls: then the writer skips, and says so). The loop itself never waits.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "airhost/callbacks.hpp"
#include "airhost/launch.hpp"
#include "base/unique_fd.hpp"
#include "launch/output/host_output.hpp"
#include "launch/output/log_stream.hpp"

namespace airhost::detail {

class RankOutput {
 public:
  struct Host {
    // Runs a callback's body so that an exception ends the run instead of unwinding uv_run.
    std::function<void(const char* where, const std::function<void()>& body)> guarded;
    // A caller's callback threw (`name`): the run ends as failed; that callback is not called again.
    std::function<void(const char* name, const std::string& what)> callback_failed;
    // The pid of the rank at `index` while it lives, else 0 (a held line of a rank that is
    // running, state R, may still get its end).
    std::function<int(int index)> live_pid;
    // A pipe of the rank at `index` is closed.
    std::function<void(int index)> closed;
  };
  struct Options {
    uv_loop_t* loop = nullptr;
    const OutputOptions* output = nullptr;
    const Callbacks* callbacks = nullptr;
    HostOutput* out = nullptr;
    // The reads' scratch space, shared with the control channels' and outliving this.
    std::string* buffer = nullptr;
  };

  RankOutput(Options options, Host host);
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  // The ranks, in order: the first added is index 0.
  // `prefix`: what its lines start with on the console when output.prefix asks for it.
  void add_rank(int rank, std::string prefix, const std::string& stdout_log, const std::string& stderr_log);
  // Takes `fd` over (which: 1 stdout, 2 stderr): from here the pipe handle owns it, and
  // close() closes it. Throws (fd closed, no handle left open) when libuv cannot watch it.
  void open(int index, int which, UniqueFd fd);
  void close(int index, int which);
  bool any_open(int index) const;
  // airhost's own word about a rank: on the console under the rank's name, on a line of its
  // own (a bar the rank was drawing is ended first), and in the host log; never in the rank's
  // log, which keeps the rank's bytes as written.
  void note(int index, const std::string& text);
  // Ends a line a rank left open on the console and flushes: the host speaks next.
  void end_open_lines();
  // The run is over: the timers close (their handles are freed as the loop ends).
  void finish();

  const std::vector<std::string>& incomplete_logs() const { return incomplete_logs_; }  // logs that stopped early, and why
  const std::vector<std::string>& trimmed_logs() const { return trimmed_logs_; }        // logs whose middle log_max_bytes cut

 private:
  struct Pipes;
  struct Channel {
    Pipes* pipes = nullptr;
    int which = 0;  // 1 stdout, 2 stderr
    uv_pipe_t pipe{};
    bool open = false;
  };
  struct Pipes {
    RankOutput* owner = nullptr;
    int index = 0;
    int rank = 0;
    std::string prefix;  // "[rank N] "
    Channel out, err;
    std::unique_ptr<RankStream> out_stream, err_stream;
    RankStream& stream(int which) { return which == 1 ? *out_stream : *err_stream; }
    Channel& channel(int which) { return which == 1 ? out : err; }
  };

  template <typename F>
  void user_callback(const char* name, bool& broken, F&& call);
  void on_show(Pipes& p, Stream stream, const ConsoleEvent& event);
  bool console_behind() const;
  void hold_reading_if_behind();
  void resume_reading_if_room();
  void flush();
  void arm_output_timer();
  void on_output_timer();
  void on_read(Channel& c, ssize_t nread, const uv_buf_t* buf);
  void read_now(Channel& c);
  int start_reading(Channel& c);
  void close(Channel& c);

  Options o_;
  Host host_;
  std::unique_ptr<Console> console_;
  std::vector<std::unique_ptr<Pipes>> ranks_;
  uv_timer_t output_timer_{};  // shows held partial lines when their quiet spell is over
  uv_timer_t resume_timer_{};  // while reading is held: looks for room again
  bool reading_held_ = false;
  bool finished_ = false;
  bool on_output_broken_ = false, on_console_broken_ = false;
  std::vector<std::string> incomplete_logs_, trimmed_logs_;
};

}  // namespace airhost::detail
