#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>

#include "airhost/exit_code.hpp"
#include "base/sigpipe.hpp"
#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "launch/output/console_writer.hpp"
#include "launch/procs/escapees.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/watch/flight_recorder.hpp"
#include "launch/watch/rank_usage.hpp"
#include "launch/rank/frames.hpp"
#include "launch/procs/group_guard.hpp"
#include "launch/output/log_stream.hpp"
#include "launch/run/run_report.hpp"
#include "launch/watch/hang_watch.hpp"
#include "launch/procs/proc_tree.hpp"
#include "launch/watch/stacks_service.hpp"

namespace airhost::detail {
namespace {

// Descriptors one recvmsg can bring. A rank sends one per result_fd frame, and Linux stops a
// read after the message that carries descriptors, so one is all a read ever brings.
constexpr std::size_t kMaxPassedFds = 8;

// How long pipes may stay open after their rank exited: a grandchild (a DataLoader worker,
// say) can hold them. Its process group is killed at exit, so this is only a safety net.
constexpr uint64_t kDrainMs = 3000;
// How long the ranks' flight recorders (NCCL) may take to dump before a timeout or a hang stops
// them: their monitor threads look at their pipes about once a second.
constexpr uint64_t kFlightRecorderWaitMs = 10000;
// How often the host samples what each rank uses (rank_usage.hpp).
constexpr uint64_t kUsageEveryMs = 5000;

// SIGUSR1 and SIGUSR2 end nothing: a scheduler's warning that the job's time is nearly up
// (Slurm's --signal=USR1@90), passed to every rank to checkpoint on (forward_warning). Nor
// does SIGQUIT (Ctrl-\): it prints every rank's stacks and the run goes on (show_stacks).
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};
constexpr int kSignalCount = sizeof kHandledSignals / sizeof kHandledSignals[0];

template <typename H>
uv_handle_t* as_handle(H* h) { return reinterpret_cast<uv_handle_t*>(h); }


}  // namespace

struct Supervisor::Impl {
  // The run's phase. Each handler below moves it, and only forward:
  //
  //   starting ──every rank spawned──▶ running ──(a rank fails | timeout | a signal, cancel()
  //      │                               │         | abort(): begin_teardown)──▶ tearing_down
  //      └──(a spawn fails)──────────────┼───────────────────────────────────────────▶ │
  //                                      └──(every rank closed)──▶ finished ◀──(every rank closed)┘
  //
  // tearing_down: each running rank's group got SIGTERM (or the host's own signal), what left
  // the groups too (escapees.hpp); SIGKILL for all when the grace period ends (or at a second
  // Ctrl-C). finished: every rank exited and its pipes reached EOF, so no output is lost; the
  // loop then closes its handles and returns.
  enum class Phase { starting, running, tearing_down, finished };

  // A rank's life, one step at a time and only forward:
  //
  //   waiting ──start_rank──▶ running ──signal_running──▶ stopping
  //      │                       │                           │
  //      │                       └────────on_exit────────────┴──▶ exited ──(its three pipes
  //      │                                                              closed)──▶ closed
  //      └──(never started: the spawn failed, or the run was torn down first)─────▶ closed
  //
  // stopping: airhost sent it a teardown signal (so its death is "stopped", not a failure,
  // unless it had raised before). exited: reaped, its pipes still draining (a grandchild may
  // hold them: kDrainMs at most).
  enum class Life { waiting, running, stopping, exited, closed };

  struct Rank;

  // One pipe from a rank: stdout, stderr or the control channel. Output pipes are read by
  // libuv (uv_pipe_t); the control channel is read here with recvmsg, watched by a uv_poll_t,
  // because it carries descriptors (FrameKind::result_fd): libuv would hand them over only
  // as handles to accept, and they must be CLOEXEC the moment they arrive, or a rank spawned
  // meanwhile would inherit another rank's result.
  struct Channel {
    Rank* rank = nullptr;
    int which = 0;  // 1 stdout, 2 stderr, 3 control
    uv_pipe_t pipe{};
    uv_poll_t poll{};  // control channel only
    int fd = -1;       // control channel only: ours to close
    bool open = false;
  };

  struct Rank {
    Impl* sup = nullptr;
    Life life = Life::waiting;
    bool stopped_by_us = false;  // reached `stopping` before it exited
    // Its exit as reaped, kept until the outcome is decided (settle): the error frame comes on
    // the control channel and the exit on another descriptor, in no set order.
    int64_t exit_status = 0;
    int exit_signal = 0;
    bool settled = false;
    RankReport report;
    std::string prefix;  // "[rank N] "
    Channel out, err, ctl;
    std::unique_ptr<RankStream> out_stream, err_stream;
    FrameDecoder frames;
    std::deque<int> passed_fds;  // received on the control channel, not yet matched to a frame
    bool stacks_watch = false;   // it reads stacks requests on its control channel (FrameKind::stacks_watch)
    uv_timer_t drain{};          // from `exited`: closes what is still open after kDrainMs

    bool alive() const { return life == Life::running || life == Life::stopping; }

    Rank() = default;
    Rank(const Rank&) = delete;
    Rank& operator=(const Rank&) = delete;
    ~Rank() {
      for (int fd : passed_fds) ::close(fd);
    }
  };

  Plan plan;
  std::unique_ptr<RankStarter> starter;
  uv_loop_t loop{};
  Phase phase = Phase::starting;
  TeardownCause cause;
  double teardown_started_at = std::numeric_limits<double>::infinity();
  std::string teardown_why;       // for plan.on_teardown: what made a rank fail
  bool teardown_cascade = false;  // ... and whether that was only a lost peer
  bool failure_stacks_pending = false;  // a rank failed; the others' stacks are being taken
  // What left the groups got a teardown signal short of SIGKILL: it may still be writing its
  // last words into a rank's pipe when the last rank exits, so it is killed only when the run
  // finishes (every pipe at EOF, or the drain timer's end) or the grace period ends.
  bool escapees_told = false;
  GroupGuard guard;
  Escapees escapees;
  std::vector<std::unique_ptr<Rank>> ranks;
  uv_timer_t timeout_timer{}, grace_timer{};
  uv_timer_t alive_timer{};  // tells plan.on_alive that the loop turns (the node link's watch)
  uv_signal_t signals[kSignalCount]{};
  struct sigaction saved_actions[kSignalCount]{};  // what the signals did before the run: put back after it
  int signal_count = 0;
  int warning_signal = 0;  // the last SIGUSR1/SIGUSR2 passed to the ranks
  std::vector<std::string> incomplete_logs;  // logs that stopped early, and why
  std::vector<std::string> trimmed_logs;     // logs whose middle log_max_bytes cut
  // Every rank's stacks on demand: Ctrl-\, `airhost stacks` through the run's socket, and
  // where each rank was when the timeout ended the run (stacks_service.hpp).
  std::unique_ptr<StacksService> stacks;
  // The hang watch (hang_watch.hpp): every rank sampled every hang_sample_every(), and one
  // report when no rank has made progress for hang_timeout.
  uv_timer_t hang_timer{};
  // torch's flight recorder asked for a dump (flight_recorder.hpp): what waits for the dumps.
  struct FlightRecorderWait {
    std::vector<int> asked;
    double since = 0;
    std::uint64_t deadline = 0;
    std::function<void()> then;
  } fr_wait;
  uv_timer_t fr_timer{};
  // What each rank uses (rank_usage.hpp): sampled every kUsageEveryMs into metrics/ranks.jsonl.
  UsageMeter usage_meter{::sysconf(_SC_CLK_TCK)};
  std::vector<RankUsage> last_usage;
  std::unique_ptr<GpuUsageReader> gpu_reader;  // a GPU run's: NVML, read off the loop
  uv_timer_t usage_timer{};
  uv_timer_t record_timer{};  // plan.on_ranks_changed, a moment after the ranks changed
  std::unique_ptr<HangWatch> hang_watch;
  std::string hang_seen;  // the report's first line, once a hang was seen

  // cancel() and abort() come from other threads, through `async`.
  uv_async_t async{};
  std::atomic<int> cancel_signal{0};
  std::atomic<bool> abort_pending{false};
  std::string abort_why;   // guarded by async_mutex until the loop reads it
  bool abort_timed_out = false, abort_hung = false;  // guarded by async_mutex
  std::vector<std::function<void()>> posted;      // guarded by async_mutex: work for the loop
  std::mutex async_mutex;  // guards async_ready: cancel() may race the loop's start and end
  bool async_ready = false;

  double start_time = 0;
  std::string read_buffer = std::string(256 * 1024, '\0');

  Impl(Plan p, std::unique_ptr<RankStarter> s) : plan(std::move(p)), starter(std::move(s)) {}

  const LaunchSpec& spec() const { return *plan.spec; }

  // ---- exceptions ------------------------------------------------------------------------

  // Every libuv callback runs its body through here: an exception must never unwind through
  // uv_run (it would skip the teardown, the report and run.json, and abort the host). It
  // ends the run instead, as a failure that names where it came from.
  template <typename F>
  void guarded(const char* where, F&& body) noexcept {
    try {
      body();
    } catch (const std::exception& e) {
      host_failure(where, e.what());
    } catch (...) {
      host_failure(where, "an exception that is not a std::exception");
    }
  }

  void host_failure(const char* where, const std::string& what) noexcept {
    try {
      const std::string text = std::string(where) + " threw: " + what;
      if (cause.host_error.empty()) cause.host_error = text;
      if (console) console->end_open_lines(), flush_output();  // the note gets a line of its own
      plan.out->say(text + "; stopping every rank");
      if (teardown_why.empty() && phase != Phase::tearing_down) teardown_why = "failed: " + text;
      begin_teardown(Outcome::failed, SIGTERM);
    } catch (...) {
      // Not even that worked (out of memory): the ranks must not outlive what watches them.
      for (auto& r : ranks)
        if (r->alive()) ::kill(-r->report.pid, SIGKILL);
    }
  }

  // A user's callback (an embedding program's on_output or on_rank_event) that throws ends
  // the run like any other failure, and is not called again.
  template <typename F>
  void user_callback(const char* name, bool& broken, F&& call) {
    if (broken) return;
    try {
      call();
    } catch (const std::exception& e) {
      broken = true;
      host_failure(name, e.what());
    } catch (...) {
      broken = true;
      host_failure(name, "an exception that is not a std::exception");
    }
  }
  bool on_output_broken = false, on_console_broken = false, on_rank_event_broken = false;

  // A rank whose control channel cannot be read any more (a corrupted or oversized frame)
  // fails with that as its error, so that the report names the channel, and the run ends.
  void fail_channel(Rank& r, const std::string& why) {
    note(r, why + "; stopping the run");
    if (!r.report.error) {
      r.report.error = ErrorRecord{"ControlChannelError",
                                   "rank " + std::to_string(r.report.rank) + "'s control channel: " + why, "", "",
                                   now_seconds()};
    }
    if (teardown_why.empty() && phase != Phase::tearing_down)
      teardown_why = "failed: rank " + std::to_string(r.report.rank) + "'s control channel: " + why;
    begin_teardown(Outcome::failed, SIGTERM);
  }

  // ---- output --------------------------------------------------------------------------

  // What the console shows of every rank (log_stream.hpp: Console) waits here and leaves in
  // one write per stream switch per read from a rank (flush_output), rather than one per
  // line: a rank printing flat out then costs the host a few syscalls per 64 KiB, not one
  // per line. This one thread writes, in the order Console gave, so lines never interleave.
  std::unique_ptr<Console> console;
  static constexpr std::size_t kFlushAt = 1u << 20;
  // The host's stdout and stderr are written by threads of their own (plan.out, for the whole
  // run): a reader that stalls (a paused terminal, a pipe nobody reads) must never stop this
  // loop (console_writer.hpp).
  static constexpr auto kFinalDrain = std::chrono::seconds(2);
  // A partial line is held this long for its end before it is shown (LiveSplitter).
  static constexpr std::uint64_t kQuietMs = 150;
  uv_timer_t output_timer{};  // shows held partial lines when their quiet spell is over
  // A console reader that takes the output slower than the ranks make it (a pipe into a busy
  // program, a slow terminal) holds the ranks back, as under plain `python`: the host stops
  // reading their stdout and stderr while the writer is behind() and starts again when it has
  // room, or when the reader stalls (then the writer skips, and says so). The loop itself
  // never waits: timers, signals and control frames go on.
  uv_timer_t resume_timer{};
  bool reading_held = false;
  static constexpr std::uint64_t kResumeCheckMs = 5;

  void on_line(Rank& r, Stream stream, std::string_view line) {
    const auto& cb = plan.callbacks->on_output;
    if (cb) user_callback("the on_output callback", on_output_broken, [&] { cb(r.report.rank, stream, line); });
  }

  void on_show(Rank& r, Stream stream, const ConsoleEvent& event) {
    const auto& out = spec().output;
    if (!out.forward && !plan.callbacks->on_console) return;
    if (!out.ranks.empty() && !out.ranks.count(r.report.rank)) return;
    console->show(r.report.rank, stream, out.prefix ? std::string_view(r.prefix) : std::string_view(), event);
    if (console->pending_bytes() >= kFlushAt) flush_output();
  }

  bool console_behind() const {
    for (ConsoleWriter* w : {plan.out->out(), plan.out->err()})
      if (w && w->behind()) return true;
    return false;
  }

  void hold_reading_if_behind() {
    if (reading_held || phase == Phase::finished || !console_behind()) return;
    reading_held = true;
    for (auto& r : ranks)
      for (Channel* c : {&r->out, &r->err})
        if (c->open) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->pipe));
    uv_timer_start(&resume_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("reading rank output again", [&] { self->resume_reading_if_room(); });
    }, kResumeCheckMs, kResumeCheckMs);
  }

  void resume_reading_if_room() {
    if (!reading_held || (console_behind() && phase != Phase::finished)) return;
    reading_held = false;
    uv_timer_stop(&resume_timer);
    const std::uint64_t now = uv_now(&loop);
    for (auto& r : ranks) {
      r->out_stream->postpone(now), r->err_stream->postpone(now);
      for (Channel* c : {&r->out, &r->err})
        if (c->open) start_reading(*c);
    }
    arm_output_timer();
  }

  void flush_output() {
    const auto& to_caller = plan.callbacks->on_console;
    // stdout's writer is stderr's when both lead to one terminal or file (host_output.hpp).
    ConsoleWriter* out_writer = plan.out->out();
    ConsoleWriter* err_writer = plan.out->err();
    for (const auto& [stream, bytes] : console->pending()) {
      if (err_writer) (stream == Stream::out ? out_writer : err_writer)->write(bytes);
      if (to_caller) user_callback("the on_console callback", on_console_broken, [&] { to_caller(stream, bytes); });
    }
    console->clear_pending();
  }

  // Streams may hold the start of a line for a while (LiveSplitter): the timer wakes the
  // loop when the first of them is due to be shown.
  void arm_output_timer() {
    if (phase == Phase::finished) return;
    std::uint64_t due = LiveSplitter::kNever;
    for (auto& r : ranks) due = std::min({due, r->out_stream->deadline(), r->err_stream->deadline()});
    if (due == LiveSplitter::kNever) {
      uv_timer_stop(&output_timer);
      return;
    }
    const std::uint64_t now = uv_now(&loop);
    uv_timer_start(&output_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("showing held rank output", [&] { self->on_output_timer(); });
    }, due > now ? due - now : 0, 0);
  }

  // A held line start whose quiet spell is over is shown, unless its end may still come:
  //  - libuv runs timers before it polls, so after the loop itself was off the CPU the rest
  //    may be in the pipe already: what is there is read first;
  //  - a rank that is running (state R: computing, or runnable but cut off the CPU on a busy
  //    machine) may be between two writes of one line; one waiting (at input(), in a sleep)
  //    is not. The line of a running rank is held on, up to kInTransitMs.
  void on_output_timer() {
    if (reading_held) return;  // the rest of a held line may be in the pipe: see resume_reading_if_room
    const std::uint64_t now = uv_now(&loop);
    for (auto& r : ranks) {
      for (int which : {1, 2}) {
        RankStream& stream = which == 1 ? *r->out_stream : *r->err_stream;
        if (stream.deadline() > now) continue;
        read_now(which == 1 ? r->out : r->err);
        if (stream.deadline() > now) continue;  // the line ended
        ProcStat st;
        if (r->alive() && read_proc_stat(static_cast<int>(r->report.pid), st) && st.state == 'R' && stream.extend(now))
          continue;
        stream.tick(now);
      }
    }
    flush_output();
    arm_output_timer();
  }

  // airhost's own word about a rank: on the console under the rank's name, on a line of its
  // own (a bar the rank was drawing is ended first), and in the host log; never in the rank's
  // log, which keeps the rank's bytes as written.
  void note(Rank& r, const std::string& text) {
    r.err_stream->show_line("airhost: " + text);
    flush_output();
    plan.out->log("rank " + std::to_string(r.report.rank) + ": " + text);
  }

  void on_frame(Rank& r, Frame&& f) {
    switch (static_cast<FrameKind>(f.kind)) {
      case FrameKind::result:
        r.report.result = std::move(f.payload);
        r.report.result_blob.reset();
        break;
      case FrameKind::result_fd: {
        if (r.passed_fds.empty()) {
          note(r, "the rank announced a result in a descriptor but sent none; no result");
          break;
        }
        const int fd = r.passed_fds.front();
        r.passed_fds.pop_front();
        try {
          auto fields = decode_fields(f.payload);
          const std::uint64_t size = std::strtoull(fields["size"].c_str(), nullptr, 10);
          r.report.result_blob = ResultBlob::adopt(fd, size);  // owns fd from here, even when it throws
          r.report.result.reset();
        } catch (const FrameError& e) {
          ::close(fd);
          note(r, std::string("the result frame is malformed (") + e.what() + "); no result");
        } catch (const std::exception& e) {
          note(r, std::string("the rank's result is ") + e.what() + "; no result");
        }
        break;
      }
      case FrameKind::error: {
        auto fields = decode_fields(f.payload);
        ErrorRecord e;
        e.type = fields["type"];
        e.message = fields["message"];
        e.traceback = fields["traceback"];
        e.pickled = std::move(fields["pickled"]);
        e.time = fields["time"].empty() ? now_seconds() : std::strtod(fields["time"].c_str(), nullptr);
        r.report.error = std::move(e);
        break;
      }
      case FrameKind::stacks_watch:
        r.stacks_watch = true;
        break;
      default:
        break;  // kinds newer than this host: skipped by design
    }
  }

  void on_read(Channel& c, ssize_t nread, const uv_buf_t* buf) {
    Rank& r = *c.rank;
    if (nread > 0) {
      std::string_view bytes(buf->base, static_cast<std::size_t>(nread));
      if (c.which == 1 || c.which == 2) {
        RankStream& stream = c.which == 1 ? *r.out_stream : *r.err_stream;
        stream.feed(bytes, uv_now(&loop));
        if (const std::string failed = stream.take_log_failure(); !failed.empty()) {
          incomplete_logs.push_back("rank " + std::to_string(r.report.rank) + ": " + failed);
          note(r, failed);
        }
      }
      flush_output();
      arm_output_timer();
      hold_reading_if_behind();
      return;
    }
    if (nread < 0) close_channel(c);  // UV_EOF or an error: either way this pipe is done
  }

  // What a rank's pipe holds now, read past libuv (the pipe is non-blocking) and fed as
  // on_read does; EOF and errors are left for libuv's own read to see.
  void read_now(Channel& c) {
    if (!c.open || reading_held) return;
    uv_os_fd_t fd;
    if (uv_fileno(as_handle(&c.pipe), &fd) < 0) return;
    for (int reads = 0; reads < 16; ++reads) {
      const ssize_t n = ::read(fd, read_buffer.data(), read_buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      const uv_buf_t buf = uv_buf_init(read_buffer.data(), static_cast<unsigned>(n));
      on_read(c, n, &buf);
      if (reading_held) return;
    }
  }

  void on_control_bytes(Channel& c, std::string_view bytes) {
    Rank& r = *c.rank;
    try {
      r.frames.feed(bytes);
      while (auto f = r.frames.next()) on_frame(r, std::move(*f));
    } catch (const std::exception& e) {  // FrameError, or what a bad frame made throw
      fail_channel(r, e.what());  // first: an exited rank settles as the channel closes
      close_channel(c);
    }
  }

  // The poll is level-triggered: a bounded number of reads per wake-up keeps a rank that
  // floods its channel from starving the others, and the rest is read on the next turn.
  void read_control(Channel& c, int status) {
    Rank& r = *c.rank;
    if (status < 0) {
      close_channel(c);
      return;
    }
    for (int reads = 0; reads < 64 && c.open; ++reads) {
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
      iovec iov{read_buffer.data(), read_buffer.size()};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(c.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) close_channel(c);
        return;
      }
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
          r.passed_fds.push_back(fd);
        }
      }
      if (msg.msg_flags & MSG_CTRUNC) note(r, "descriptors sent on the control channel were lost (too many at once)");
      if (n == 0) {
        close_channel(c);
        return;
      }
      on_control_bytes(c, std::string_view(read_buffer.data(), static_cast<std::size_t>(n)));
    }
  }

  void close_channel(Channel& c) {
    if (!c.open) return;
    c.open = false;
    Rank& r = *c.rank;
    if (c.which == 3) {
      settle(r);  // the last of its frames is in (or never will be)
      uv_poll_stop(&c.poll);
      uv_close(as_handle(&c.poll), [](uv_handle_t* h) {
        auto* ch = static_cast<Channel*>(h->data);
        ::close(ch->fd);  // only now: libuv must not watch a descriptor that was closed
        ch->fd = -1;
        ch->rank->sup->maybe_closed(*ch->rank);
      });
      return;
    }
    if (c.which == 1 || c.which == 2) {
      RankStream& stream = c.which == 1 ? *r.out_stream : *r.err_stream;
      stream.finish();
      if (!stream.trimmed().empty()) trimmed_logs.push_back("rank " + std::to_string(r.report.rank) + ": " + stream.trimmed());
    }
    flush_output();
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.pipe));
    uv_close(as_handle(&c.pipe), [](uv_handle_t* h) {
      auto* ch = static_cast<Channel*>(h->data);
      ch->rank->sup->maybe_closed(*ch->rank);
    });
  }

  // Takes `fd` over: from here the pipe handle owns it, and closing the channel closes it.
  // Throws (fd closed, no handle left open) when libuv cannot watch it.
  void open_channel(Rank& r, Channel& c, int which, UniqueFd fd) {
    c.rank = &r;
    c.which = which;
    if (int rc = uv_pipe_init(&loop, &c.pipe, 0); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's output (uv_pipe_init)");
    c.pipe.data = &c;
    if (int rc = uv_pipe_open(&c.pipe, fd.get()); rc < 0) {
      uv_close(as_handle(&c.pipe), nullptr);  // fd is still ours: UniqueFd closes it
      throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's output (uv_pipe_open)");
    }
    fd.release();
    c.open = true;
    if (reading_held) return;  // started with the others when the console has room again
    if (const int rc = start_reading(c); rc < 0) {
      close_channel(c);
      throw std::system_error(-rc, std::generic_category(), "cannot read a rank's output (uv_read_start)");
    }
  }

  int start_reading(Channel& c) {
    return uv_read_start(
        reinterpret_cast<uv_stream_t*>(&c.pipe),
        [](uv_handle_t* h, size_t, uv_buf_t* buf) {
          auto* sup = static_cast<Channel*>(h->data)->rank->sup;
          *buf = uv_buf_init(sup->read_buffer.data(), static_cast<unsigned>(sup->read_buffer.size()));
        },
        [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
          auto* ch = static_cast<Channel*>(s->data);
          ch->rank->sup->guarded("reading a rank's output", [&] { ch->rank->sup->on_read(*ch, n, buf); });
        });
  }

  // Takes `fd` over, like open_channel; the channel closes it after its poll handle is closed.
  void open_control(Rank& r, UniqueFd fd) {
    Channel& c = r.ctl;
    c.rank = &r;
    c.which = 3;
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
    if (int rc = uv_poll_init(&loop, &c.poll, fd.get()); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's control channel (uv_poll_init)");
    c.fd = fd.release();
    c.poll.data = &c;
    c.open = true;
    const int rc = uv_poll_start(&c.poll, UV_READABLE | UV_DISCONNECT, [](uv_poll_t* p, int status, int) {
      auto* ch = static_cast<Channel*>(p->data);
      ch->rank->sup->guarded("reading a rank's control channel", [&] { ch->rank->sup->read_control(*ch, status); });
    });
    if (rc < 0) {
      close_channel(c);
      throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's control channel (uv_poll_start)");
    }
  }

  // ---- processes -----------------------------------------------------------------------

  // Two pipes and a socket pair, owned until each end has its next owner: a failure half way
  // (EMFILE at the socket pair, say) closes what was already made.
  static void make_pipe(UniqueFd& read_end, UniqueFd& write_end, const char* what) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0)
      throw std::system_error(errno, std::generic_category(), std::string("cannot create a rank's ") + what + " pipe");
    read_end.reset(fds[0]);
    write_end.reset(fds[1]);
  }

  void start_rank(Rank& r) {
    UniqueFd out_r, out_w, err_r, err_w, ctl_host, ctl_rank;
    make_pipe(out_r, out_w, "stdout");
    make_pipe(err_r, err_w, "stderr");
    int ctl[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0)
      throw std::system_error(errno, std::generic_category(), "cannot create a rank's control channel");
    ctl_host.reset(ctl[0]);
    ctl_rank.reset(ctl[1]);
    // 1 MiB pipes (Linux's default limit for one pipe, best effort): a rank printing flat out
    // fills 16 times more before it waits, and the host reads it in fewer, larger reads.
    for (int fd : {out_r.get(), err_r.get()}) ::fcntl(fd, F_SETPIPE_SZ, 1 << 20);

    RankStartRequest req;
    req.local_rank = r.report.local_rank;
    req.argv = plan.rank_argv;
    req.env = build_rank_env(spec(), r.report.local_rank, plan.context, plan.base_env);
    req.cwd = spec().working_dir;
    req.stdout_fd = out_w.get();
    req.stderr_fd = err_w.get();
    req.control_fd = ctl_rank.get();

    // From here the channels own the host's ends: on a failure, on_start_failed closes them.
    open_channel(r, r.out, 1, std::move(out_r));
    open_channel(r, r.err, 2, std::move(err_r));
    open_control(r, std::move(ctl_host));
    r.report.pid = starter->start(&loop, req, [this, &r](int64_t status, int sig) {
      guarded("handling a rank's exit", [&] { on_exit(r, status, sig); });
    });
    guard.add(r.report.pid);
    // Our copies of the child's ends go as this returns (UniqueFd), or the pipes would never
    // reach EOF; on a throw above they go too.
    r.life = Life::running;
    r.report.state = RankState::running;
    r.report.started_at = now_seconds();
    ranks_changed();
    if (plan.callbacks->on_rank_event)
      user_callback("the on_rank_event callback", on_rank_event_broken, [&] {
        plan.callbacks->on_rank_event({RankEvent::Kind::started, r.report.rank, r.report.pid, 0, 0});
      });
  }

  // The live record (Plan::on_ranks_changed): one write for a burst of starts or exits.
  static constexpr std::uint64_t kRecordEveryMs = 50;
  void ranks_changed() {
    if (!plan.on_ranks_changed || phase == Phase::finished || uv_is_active(as_handle(&record_timer))) return;
    uv_timer_start(&record_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("recording the ranks", [&] {
        std::vector<RankReport> now;
        for (auto& r : self->ranks) {
          RankReport k;
          const RankReport& was = r->report;
          k.rank = was.rank, k.local_rank = was.local_rank, k.pid = was.pid, k.state = was.state;
          k.exit_code = was.exit_code, k.term_signal = was.term_signal, k.error = was.error;
          k.stdout_log = was.stdout_log, k.stderr_log = was.stderr_log;
          k.started_at = was.started_at, k.ended_at = was.ended_at;
          if (was.result || was.result_blob) k.result.emplace();  // has_result, not the bytes
          now.push_back(std::move(k));
        }
        self->plan.on_ranks_changed(now);
      });
    }, kRecordEveryMs, 0);
  }

  // A rank could not be started: it failed, and so does the run.
  void on_start_failed(Rank& r, const std::exception& e) {
    note(r, e.what());
    r.report.state = RankState::failed;
    r.report.exit_code = 127;
    r.report.ended_at = now_seconds();
    r.report.error = ErrorRecord{"LaunchError", e.what(), "", "", r.report.ended_at};
    close_channel(r.out);
    close_channel(r.err);
    close_channel(r.ctl);
    r.life = Life::closed;
    begin_teardown(Outcome::failed, SIGTERM);
  }

  // running/stopping → exited: the rank was reaped. Its outcome waits for the end of its
  // control channel (settle), bounded by the drain timer.
  void on_exit(Rank& r, int64_t status, int sig) {
    r.stopped_by_us = r.life == Life::stopping;
    r.life = Life::exited;
    r.exit_status = status;
    r.exit_signal = sig;
    r.report.ended_at = now_seconds();
    r.report.exit_code = sig ? -1 : static_cast<int>(status);
    r.report.term_signal = sig;
    // Whatever the rank left behind in its process group (workers, daemons) goes with it.
    ::kill(-r.report.pid, SIGKILL);
    guard.remove(r.report.pid);

    // The last rank is gone: so goes whatever of the run still runs outside the ranks'
    // groups (a server started in a new session, a daemon), before the pipes it may hold
    // keep the run waiting. Unless a teardown signal was sent to it: then it has until the
    // run finishes (its pipes at EOF, or kDrainMs) or the grace period ends to say its last
    // words and end by itself, as the ranks had.
    bool any_alive = false;
    for (auto& other : ranks) any_alive |= other->alive();
    if (!any_alive && !escapees_told) escapees.kill_all();

    uv_timer_init(&loop, &r.drain);
    r.drain.data = &r;
    uv_timer_start(&r.drain, [](uv_timer_t* t) {
      auto* rk = static_cast<Rank*>(t->data);
      rk->sup->guarded("closing an exited rank's pipes", [&] {
        rk->sup->close_channel(rk->out);
        rk->sup->close_channel(rk->err);
        rk->sup->close_channel(rk->ctl);
      });
    }, kDrainMs, 0);
    if (!r.ctl.open) settle(r);
    maybe_closed(r);
  }

  // exited, with every frame of its control channel read (EOF, or the drain timer gave up
  // on it): its outcome, from all the evidence whatever order it came in. A rank that raised
  // is then named with its exception even when its exit was seen first.
  void settle(Rank& r) {
    if (r.settled || r.life != Life::exited) return;
    r.settled = true;
    const int64_t status = r.exit_status;
    const int sig = r.exit_signal;
    const bool ok = sig == 0 && status == 0;
    // A rank that raised before the teardown began is a failure even if our signal is what
    // finally ended it (slow atexit handlers): it may well be the root cause.
    const bool raised_first = r.report.error && r.report.error->time <= teardown_started_at;
    if (ok) r.report.state = RankState::succeeded;
    else if (r.stopped_by_us && !raised_first) r.report.state = RankState::stopped;
    else r.report.state = RankState::failed;
    ranks_changed();

    if (plan.callbacks->on_rank_event)
      user_callback("the on_rank_event callback", on_rank_event_broken, [&] {
        plan.callbacks->on_rank_event({RankEvent::Kind::exited, r.report.rank, r.report.pid, r.report.exit_code, sig});
      });

    if (!ok && !r.stopped_by_us) {
      if (phase != Phase::tearing_down && !failure_stacks_pending) {
        teardown_why = "failed: rank " + std::to_string(r.report.rank) +
                       (sig ? " was killed by " + signal_name(sig) : " exited with code " + std::to_string(status));
        if (r.report.error) {
          const auto& m = r.report.error->message;
          teardown_why += " (" + r.report.error->type + ": " + m.substr(0, std::min(m.find('\n'), std::size_t{200})) + ")";
          teardown_cascade = is_lost_peer_error(*r.report.error);
        }
      }
      stop_after_failure(r.report.rank);
    }
  }

  // A rank failed: before the others are stopped, where each of them is, so that no run ends
  // without saying where its ranks were (a survivor waiting in all_reduce for the dead rank,
  // or one stuck elsewhere that the failure only revealed). The stacks take a few ms, 3 s at
  // most for a rank that does not answer; a rank failing meanwhile waits for the same end.
  void stop_after_failure(int failed_rank) {
    if (failure_stacks_pending) return;
    bool others = false;
    for (auto& k : ranks) others = others || (k->alive() && k->report.pid > 0);
    if (phase != Phase::running || cause.torn_down || !stacks || !others) {
      begin_teardown(Outcome::failed, SIGTERM);
      return;
    }
    failure_stacks_pending = true;
    begin_teardown(Outcome::failed, SIGTERM, false);
    show_stacks("rank " + std::to_string(failed_rank) + " failed: where the other ranks are, before they are stopped",
                [this] { stop_ranks(SIGTERM); });
  }

  // exited → closed, once its three pipes are closed.
  void maybe_closed(Rank& r) {
    if (r.life != Life::exited || r.out.open || r.err.open || r.ctl.open) return;
    r.life = Life::closed;
    uv_timer_stop(&r.drain);
    maybe_finish();
  }

  // running → stopping, for every rank still alive; what left the groups gets it too (all of
  // the run at once for SIGKILL).
  void signal_running(int sig) {
    for (auto& r : ranks) {
      if (!r->alive()) continue;
      r->life = Life::stopping;
      ::kill(-r->report.pid, sig);
    }
    if (sig == SIGKILL) {
      escapees.kill_all();
      escapees_told = false;
    } else {
      escapees.signal(sig);
      escapees_told = true;
    }
  }

  // → tearing_down (once): a rank failed, the timeout passed, the host got a signal, cancel()
  // or abort() was called.
  // `stop`: false when the caller signals the ranks itself a moment later (stop_after_failure);
  // the outcome is settled here either way, so a run whose ranks all end meanwhile keeps it.
  void begin_teardown(Outcome reason, int sig, bool stop = true) {
    if (phase == Phase::finished) return;
    if (cause.torn_down) {
      // A second Ctrl-C means "now": skip the rest of the grace period.
      if (reason == Outcome::interrupted) signal_running(SIGKILL);
      return;
    }
    phase = Phase::tearing_down;
    cause.torn_down = true;
    cause.reason = reason;
    cause.timeout_seconds = static_cast<long>(spec().timeout.count());
    if (reason == Outcome::interrupted) cause.interrupt_signal = sig;
    teardown_started_at = now_seconds();
    if (plan.on_teardown) {
      std::string why = reason == Outcome::timed_out && !cause.hang.empty() ? "hung: " + cause.hang
                        : reason == Outcome::timed_out     ? "timed out (--timeout " + std::to_string(spec().timeout.count()) + " s)"
                        : reason == Outcome::interrupted ? "was interrupted by " + signal_name(sig)
                        : reason == Outcome::node_lost   ? "stopped its ranks (" + cause.node_lost_why + ")"
                        : teardown_why.empty()           ? std::string("failed")
                                                         : teardown_why;
      plan.on_teardown(reason, why, reason == Outcome::node_lost || (reason == Outcome::failed && teardown_cascade),
                       reason == Outcome::timed_out && !cause.hang.empty());
    }
    if (stop) stop_ranks(sig);
  }

  void stop_ranks(int sig) {
    if (phase == Phase::finished) return;
    signal_running(sig);
    const auto grace = static_cast<uint64_t>(std::max<int64_t>(0, spec().grace.count()));
    uv_timer_start(&grace_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("the grace period's end", [&] { self->signal_running(SIGKILL); });
    }, grace, 0);
  }

  // From other threads, through `async`: cancel() as an interrupt, abort() as a lost node.
  void on_async() {
    std::vector<std::function<void()>> work;
    {
      std::lock_guard lock(async_mutex);
      work.swap(posted);
    }
    for (auto& w : work) w();
    if (int sig = cancel_signal.exchange(0)) begin_teardown(Outcome::interrupted, sig);
    if (!abort_pending.exchange(false)) return;
    bool timed_out, hung;
    {
      std::lock_guard lock(async_mutex);
      if (cause.node_lost_why.empty()) cause.node_lost_why = abort_why;
      timed_out = abort_timed_out, hung = abort_hung;
    }
    if (timed_out && !cause.torn_down) {
      if (hung) cause.hang = hang_seen = cause.node_lost_why;
      return begin_teardown(Outcome::timed_out, SIGTERM);
    }
    begin_teardown(Outcome::node_lost, SIGTERM);
  }

  // Work for the loop's thread, from any thread; dropped once the loop has ended.
  void post(std::function<void()> work) {
    std::lock_guard lock(async_mutex);
    posted.push_back(std::move(work));
    if (async_ready) uv_async_send(&async);
  }

  // Another node: node 0 asked for this node's ranks' stacks.
  void answer_stacks_ask(unsigned seq, const std::string& only_text) {
    if (!stacks || !plan.answer_stacks || phase == Phase::finished) return;
    std::vector<int> only;
    for (const auto& rank : split(only_text, ',')) only.push_back(std::atoi(rank.c_str()));
    stacks->collect([this, seq](const StacksSnapshot& snap) {
      guarded("answering node 0's request for stacks", [&] {
        std::vector<RankStacks> ranks = snap.ranks;
        const auto by_group = group_cpu();
        for (auto& r : ranks)
          if (auto it = by_group.find(r.pid); r.pid > 0 && it != by_group.end()) r.cpu_ticks = static_cast<long long>(it->second);
        plan.answer_stacks(seq, ranks);
      });
    }, false, only_text.empty() ? nullptr : &only);
  }

  // ---- completion ----------------------------------------------------------------------

  bool all_closed() const {
    for (auto& r : ranks)
      if (r->life != Life::closed && r->life != Life::waiting) return false;
    return phase != Phase::starting;
  }

  // → finished: every rank closed. Closes the loop's own handles so that uv_run returns.
  void maybe_finish() {
    if (phase == Phase::finished || !all_closed()) return;
    phase = Phase::finished;
    uv_close(as_handle(&timeout_timer), nullptr);
    uv_close(as_handle(&grace_timer), nullptr);
    uv_close(as_handle(&output_timer), nullptr);
    uv_close(as_handle(&resume_timer), nullptr);
    uv_close(as_handle(&alive_timer), nullptr);
    uv_close(as_handle(&hang_timer), nullptr);
    uv_close(as_handle(&fr_timer), nullptr);
    uv_close(as_handle(&usage_timer), nullptr);
    uv_close(as_handle(&record_timer), nullptr);  // the final record is the launcher's
    if (escapees_told) escapees.kill_all();  // what a teardown signal did not end by now
    escapees.close();
    if (stacks) stacks->close();
    if (signal_count) {
      // libuv leaves a signal it stops watching at SIG_DFL; what the program had before the
      // run is put back instead (the CLI's handler: as PID 1 a signal at SIG_DFL would be
      // lost). Blocked meanwhile, so that none arrives in between.
      sigset_t block, old;
      sigemptyset(&block);
      for (int sig : kHandledSignals) sigaddset(&block, sig);
      ::pthread_sigmask(SIG_BLOCK, &block, &old);
      for (int i = 0; i < signal_count; ++i) {
        uv_close(as_handle(&signals[i]), nullptr);
        ::sigaction(kHandledSignals[i], &saved_actions[i], nullptr);
      }
      ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    {
      std::lock_guard lock(async_mutex);
      async_ready = false;
      uv_close(as_handle(&async), nullptr);
    }
    for (auto& r : ranks)
      if (r->drain.data) uv_close(as_handle(&r->drain), nullptr);  // initialised at exit
    starter->close();
    guard.stop();
  }

  RunReport report() {
    RunReport rep;
    rep.run_id = plan.context.run_id;
    rep.run_dir = plan.context.run_dir;
    rep.wall_seconds = now_seconds() - start_time;
    rep.interrupt_signal = cause.interrupt_signal;
    rep.warning_signal = warning_signal;
    rep.hang = hang_seen;
    rep.incomplete_logs = incomplete_logs;
    rep.trimmed_logs = trimmed_logs;
    std::vector<bool> signalled;
    for (auto& r : ranks) {
      rep.ranks.push_back(r->report);
      signalled.push_back(r->stopped_by_us);
    }
    conclude_run(rep, cause, signalled);
    if (warning_signal && !rep.ok()) {
      // Stopping is what the warning asked for: the run says so before how its ranks left.
      const std::string run = "run " + rep.run_id;
      std::string how = rep.message.rfind(run, 0) == 0 ? rep.message.substr(run.size()) : rep.message;
      while (!how.empty() && (how.front() == ':' || how.front() == ' ')) how.erase(0, 1);
      rep.message = run + " stopped after the scheduler's warning (" + signal_name(warning_signal) + "): " + how;
    }
    return rep;
  }

  // ---- the run -------------------------------------------------------------------------

  void watch_signals() {
    for (int sig : kHandledSignals) {
      ::sigaction(sig, nullptr, &saved_actions[signal_count]);
      auto& h = signals[signal_count++];
      uv_signal_init(&loop, &h);
      h.data = this;
      uv_signal_start(&h, [](uv_signal_t* s, int signum) {
        auto* self = static_cast<Impl*>(s->data);
        if (signum == SIGUSR1 || signum == SIGUSR2)
          self->guarded("passing a signal on", [&] { self->forward_warning(signum); });
        else if (signum == SIGQUIT)
          self->guarded("showing the ranks' stacks", [&] { self->show_stacks(""); });
        else
          self->guarded("handling a signal", [&] { self->begin_teardown(Outcome::interrupted, signum); });
      }, sig);
    }
  }

  // The run goes on: each rank's main process gets the signal (not its group: a DataLoader
  // worker would die of it), where airhost's handler records it for
  // airhost.preemption_requested(); the training loop checkpoints and leaves.
  void forward_warning(int sig) {
    const bool first = warning_signal == 0;
    warning_signal = sig;
    int sent = 0;
    for (auto& r : ranks)
      if (r->report.state == RankState::running && r->report.pid > 0 && ::kill(r->report.pid, sig) == 0) ++sent;
    const std::string name = signal_name(sig);
    if (first)
      plan.out->say(name + ": the scheduler's warning that the job's time is nearly up; passed to " +
                    std::to_string(sent) + " rank(s): checkpoint and stop (airhost.preemption_requested())");
    else
      plan.out->log(name + " again; passed to " + std::to_string(sent) + " rank(s)");
  }

  // The grouped stacks, a line at a time on the terminal and in the host log, after `headline`
  // if given; a bar or prompt a rank left open is ended first.
  void say_stacks(const StacksSnapshot& snap, const std::string& headline = {}) {
    if (console) console->end_open_lines(), flush_output();
    if (!headline.empty()) plan.out->say(headline);
    const std::string text = render_text(snap, false);
    std::size_t at = 0;
    while (at < text.size()) {
      const auto nl = text.find('\n', at);
      plan.out->say(std::string_view(text).substr(at, nl == std::string::npos ? std::string::npos : nl - at));
      at = nl == std::string::npos ? text.size() : nl + 1;
    }
  }

  // Every rank's stacks, grouped, on the terminal (and in the host log), the full stacks in
  // <run_dir>/stacks/<time>.txt; `then` runs once they are shown. Ranks take no harm: the
  // signal they get only makes them write their stacks.
  void show_stacks(const std::string& why, std::function<void()> then = {}) {
    if (!stacks || phase == Phase::finished) {
      if (then) then();
      return;
    }
    if (!why.empty()) plan.out->say(why);
    stacks->collect([this, then = std::move(then)](const StacksSnapshot& snap) {
      guarded("showing the ranks' stacks", [&] {
        say_stacks(snap);
        if (then) then();
      });
    });
  }

  // Every kUsageEveryMs: each live rank's CPU and memory, from /proc, appended to
  // <run_dir>/metrics/ranks.jsonl (a disk that refuses it costs the series, never the run).
  void start_usage() {
    if (!spec().devices.empty()) {
      gpu_reader = std::make_unique<GpuUsageReader>();
      gpu_reader->request();  // NVML opens meanwhile: the first sample has its figures
    }
    uv_timer_start(&usage_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("sampling what the ranks use", [&] { self->sample_usage(); });
    }, kUsageEveryMs, kUsageEveryMs);
  }

  void sample_usage() {
    std::vector<std::pair<int, int>> alive;
    for (auto& r : ranks)
      if (r->alive() && r->report.pid > 0) alive.push_back({r->report.rank, r->report.pid});
    if (alive.empty()) return;
    const auto procs = list_processes();
    const double now = now_seconds();
    last_usage = usage_meter.sample(now, alive, procs, spec().node_rank);
    if (gpu_reader) {
      // The reading asked for at the last sample (NVML never runs on the loop); one older than
      // two samples means NVML is stuck, and its figures are left out rather than shown stale.
      const auto gpus = gpu_reader->latest();
      gpu_reader->request();
      if (gpus && now - gpus->taken_at < 2.5 * kUsageEveryMs / 1000.0) {
        const auto& devices = spec().devices;
        std::map<int, std::vector<int>> members;  // process group (a rank's pid) → its pids
        for (const auto& p : procs) members[p.pgid].push_back(p.pid);
        std::map<int, int> pid_of(alive.begin(), alive.end());  // rank → pid
        for (auto& u : last_usage) {
          const int local = u.rank - spec().node_rank * spec().nprocs;
          const int device = local >= 0 && static_cast<std::size_t>(local) < devices.size() ? devices[static_cast<std::size_t>(local)] : -1;
          add_gpu_usage(u, members[pid_of[u.rank]], device, *gpus);
        }
      }
    }
    std::string lines;
    for (const auto& u : last_usage) lines += usage_json_line(u);
    const std::string dir = plan.context.run_dir + "/metrics";
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
    const int fd = ::open((dir + "/ranks.jsonl").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return;
    (void)!::write(fd, lines.data(), lines.size());
    ::close(fd);
  }

  // The ranks' CPU and memory at the last sample, one line in a report, when there is one.
  void say_usage() {
    const std::string text = usage_text(last_usage);
    if (!text.empty()) plan.out->say(text);
  }

  // With several nodes, node 0 alone watches, over every rank of the job (the others answer
  // its requests through the node link): a node's own ranks all waiting in a collective say
  // nothing of who holds them up.
  void start_hang_watch() {
    if (spec().hang_timeout.count() <= 0 || !stacks) return;
    if (spec().nnodes > 1 && spec().node_rank != 0) return;
    hang_watch = std::make_unique<HangWatch>(spec().hang_timeout, ::sysconf(_SC_CLK_TCK));
    const auto every = static_cast<uint64_t>(hang_sample_every(spec().hang_timeout).count());
    uv_timer_start(&hang_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("the hang watch", [&] { self->sample_for_hangs(); });
    }, every, every);
  }

  // CPU time of each rank's process group (the rank leads its own): what it started counts,
  // DataLoader workers and all.
  std::map<int, std::uint64_t> group_cpu() const {
    std::map<int, std::uint64_t> by_pgid;
    for (const auto& p : list_processes()) by_pgid[p.pgid] += p.cpu;
    return by_pgid;
  }

  void sample_for_hangs() {
    if (phase != Phase::running || !hang_watch) return;
    // CPU time first: a rank busy outside torch.distributed made progress, and is not asked
    // for its stack (the request's signal would cut short what it is doing); the others are.
    auto cpu = std::make_shared<std::map<int, std::uint64_t>>();  // by rank
    const auto by_group = group_cpu();
    std::vector<int> ask;
    for (auto& r : ranks) {
      if (!r->alive() || r->report.pid <= 0) continue;
      auto it = by_group.find(r->report.pid);
      const std::uint64_t used = it == by_group.end() ? 0 : it->second;
      (*cpu)[r->report.rank] = used;
      if (hang_watch->wants_stack(r->report.rank, used, now_seconds())) ask.push_back(r->report.rank);
    }
    // The other nodes' ranks are always asked: their answers bring their CPU time along.
    const int world = spec().nnodes * spec().nprocs;
    for (int rank = 0; rank < world; ++rank)
      if (rank / spec().nprocs != spec().node_rank) ask.push_back(rank);
    stacks->collect([this, cpu](const StacksSnapshot& snap) {
      guarded("the hang watch", [&] {
        if (phase != Phase::running || !hang_watch) return;
        std::vector<HangSample> samples;
        for (const auto& r : snap.ranks) {
          const auto it = cpu->find(r.rank);
          const std::uint64_t used = it != cpu->end() ? it->second : r.cpu_ticks > 0 ? static_cast<std::uint64_t>(r.cpu_ticks) : 0;
          HangSample s = r.status == "not asked" ? hang_watch->carried(r.rank, used) : hang_sample(r);
          s.cpu = used;
          samples.push_back(std::move(s));
        }
        const double now = now_seconds();
        if (hang_watch->feed(now, samples)) report_hang(hang_watch->still_for(now));
      });
    }, false, &ask);
  }

  // No rank has made progress for hang_timeout: one report (the stacks kept in the run
  // directory), then the run goes on, or ends as its timeout ends it (--on-hang stop).
  void report_hang(double still) {
    stacks->collect([this, still](const StacksSnapshot& snap) {
      guarded("the hang report", [&] {
        if (phase != Phase::running) return;
        hang_seen = hang_headline(snap, still, spec().hang_timeout);
        say_stacks(snap, "run " + plan.context.run_id + ": " + hang_seen +
                             (snap.file.empty() ? "" : "; every rank's stacks: " + snap.file));
        say_usage();
        if (spec().stop_on_hang) {
          cause.hang = hang_seen;
          ask_flight_recorder([this] { begin_teardown(Outcome::timed_out, SIGTERM); }, true);
        } else {
          ask_flight_recorder({}, false);
          plan.out->say("the run goes on (--on-hang report); airhost stacks " + plan.context.run_id +
                        " shows where the ranks are now");
        }
      });
    });
  }

  // GPU ranks stuck: their NCCL flight recorders are asked for a dump of their recent
  // collectives (flight_recorder.hpp), read back into the summary when the run ends. `wait`:
  // `then` runs once every asked rank dumped, or kFlightRecorderWaitMs passed (the ranks are
  // about to be stopped, and would take their rings with them); else at once.
  void ask_flight_recorder(std::function<void()> then, bool wait) {
    const std::string dir = plan.context.run_dir + "/stacks";
    const double since = now_seconds();
    auto asked = poke_flight_recorder(dir, kFlightRecorderPrefix);
    if (!asked.empty())
      plan.out->say("asked torch's flight recorder of " + std::string(asked.size() == 1 ? "rank " : "ranks ") +
                    rank_ranges(asked) + " for its recent collectives (NCCL): " + dir + "/" + kFlightRecorderPrefix + "N");
    if (asked.empty() || !wait) {
      if (then) then();
      return;
    }
    fr_wait = {std::move(asked), since, uv_now(&loop) + kFlightRecorderWaitMs, std::move(then)};
    uv_timer_start(&fr_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("waiting for the flight recorder's dumps", [&] {
        auto& w = self->fr_wait;
        const auto done = flight_recorder_dumped(self->plan.context.run_dir + "/stacks", kFlightRecorderPrefix, w.asked, w.since);
        if (done.size() < w.asked.size() && uv_now(&self->loop) < w.deadline) return;
        uv_timer_stop(t);
        if (done.size() < w.asked.size())
          self->plan.out->say("the flight recorder of " + std::to_string(w.asked.size() - done.size()) + " rank(s) did not dump within " +
                              std::to_string(kFlightRecorderWaitMs / 1000) + " s");
        auto then = std::move(w.then);
        w = {};
        if (then) then();
      });
    }, 100, 100);
  }

  void start_stacks() {
    StacksService::Options o;
    o.loop = &loop;
    o.run_id = plan.context.run_id;
    o.run_dir = plan.context.run_dir;
    o.node = spec().node_rank;
    o.nnodes = spec().nnodes;
    o.nprocs = spec().nprocs;
    if (spec().node_rank == 0) o.ask_nodes = plan.ask_stacks;
    o.ranks = [this] {
      std::vector<StacksService::Rank> list;
      for (auto& r : ranks)
        list.push_back({r->report.rank, r->report.local_rank, r->report.pid, r->alive() && r->report.pid > 0,
                        r->stacks_watch && r->ctl.open ? r->ctl.fd : -1});
      return list;
    };
    stacks = std::make_unique<StacksService>(std::move(o));
    if (const std::string why = stacks->start(); !why.empty())
      plan.out->log("airhost stacks cannot reach this run (" + why + "); Ctrl-\\ still shows the stacks");
  }

  // Should this process die by SIGKILL, the guard ends what the ranks started. It gets the
  // caller's environment (what airhost-rank needs to load: LD_LIBRARY_PATH, say) and the
  // run's id and directory, which name it as the run's in /proc.
  void start_guard() {
    std::vector<std::string> guard_env;
    for (const auto& e : plan.base_env)
      if (e.rfind("AIRHOST_RUN_ID=", 0) != 0 && e.rfind("AIRHOST_RUN_DIR=", 0) != 0) guard_env.push_back(e);
    guard_env.push_back("AIRHOST_RUN_ID=" + plan.context.run_id);
    guard_env.push_back("AIRHOST_RUN_DIR=" + plan.context.run_dir);
    guard.start(&loop, plan.rank_argv.at(0), guard_env);
  }

  void make_ranks() {
    const int nprocs = spec().nprocs;
    for (int i = 0; i < nprocs; ++i) {
      auto r = std::make_unique<Rank>();
      r->sup = this;
      r->report.local_rank = i;
      r->report.rank = spec().node_rank * nprocs + i;
      r->prefix = rank_prefix(r->report.rank);
      const std::string base = plan.context.run_dir + "/logs/rank-" + std::to_string(r->report.rank);
      r->report.stdout_log = base + ".stdout.log";
      r->report.stderr_log = base + ".stderr.log";
      Rank* raw = r.get();
      auto make_stream = [&](const std::string& log, Stream stream) {
        RankStream::OnLine lines;  // split into lines only for a caller that asks for them
        if (plan.callbacks->on_output) lines = [this, raw, stream](std::string_view l) { on_line(*raw, stream, l); };
        return std::make_unique<RankStream>(log, spec().output.max_line, kQuietMs, std::move(lines),
                                            [this, raw, stream](const ConsoleEvent& e) { on_show(*raw, stream, e); },
                                            spec().output.log_max_bytes);
      };
      r->out_stream = make_stream(r->report.stdout_log, Stream::out);
      r->err_stream = make_stream(r->report.stderr_log, Stream::err);
      ranks.push_back(std::move(r));
    }
  }

  RunReport run() {
    start_time = now_seconds();
    if (int rc = uv_loop_init(&loop); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "uv_loop_init");
    uv_timer_init(&loop, &timeout_timer);
    uv_timer_init(&loop, &grace_timer);
    uv_timer_init(&loop, &output_timer);
    uv_timer_init(&loop, &resume_timer);
    uv_timer_init(&loop, &alive_timer);
    uv_timer_init(&loop, &hang_timer);
    uv_timer_init(&loop, &fr_timer);
    fr_timer.data = this;
    uv_timer_init(&loop, &usage_timer);
    usage_timer.data = this;
    uv_timer_init(&loop, &record_timer);
    record_timer.data = this;
    timeout_timer.data = grace_timer.data = output_timer.data = resume_timer.data = alive_timer.data = hang_timer.data = this;
    if (plan.on_alive) {
      plan.on_alive();
      const auto every = static_cast<std::uint64_t>(std::max<long long>(plan.alive_every.count(), 1));
      uv_timer_start(&alive_timer, [](uv_timer_t* t) {
        auto* self = static_cast<Impl*>(t->data);
        self->guarded("the loop's heartbeat", [&] { self->plan.on_alive(); });
      }, every, every);
    }
    // One terminal (or file) behind both: a line open on stdout must end before stderr writes.
    console = std::make_unique<Console>(same_file(STDOUT_FILENO, STDERR_FILENO));
    uv_async_init(&loop, &async, [](uv_async_t* a) {
      auto* self = static_cast<Impl*>(a->data);
      self->guarded("handling cancel() or abort()", [&] { self->on_async(); });
    });
    async.data = this;
    {
      std::lock_guard lock(async_mutex);
      async_ready = true;
    }
    if (spec().handle_signals) watch_signals();
    escapees.start(&loop, &guard, plan.context.run_id, spec().reap_orphans, [this] {
      std::set<int> pids;
      for (auto& r : ranks)
        if (r->alive()) pids.insert(r->report.pid);
      return pids;
    });
    start_guard();
    make_ranks();
    start_stacks();

    // starting: spawn every rank, unless the run is torn down meanwhile.
    for (auto& r : ranks) {
      if (cause.torn_down) break;
      try {
        start_rank(*r);
      } catch (const std::exception& e) {
        on_start_failed(*r, e);
      }
    }
    if (phase == Phase::starting) phase = Phase::running;
    if (plan.time_limit.count() > 0) {
      uv_timer_start(&timeout_timer, [](uv_timer_t* t) {
        auto* self = static_cast<Impl*>(t->data);
        // Where each rank was, before they are stopped: no run ends by its timeout without it.
        self->guarded("the timeout", [&] {
          self->show_stacks("the timeout passed: where each rank is, before they are stopped", [self] {
            self->say_usage();
            self->ask_flight_recorder([self] { self->begin_teardown(Outcome::timed_out, SIGTERM); }, true);
          });
        });
      }, static_cast<uint64_t>(plan.time_limit.count()), 0);
    }
    start_hang_watch();
    start_usage();
    on_async();      // a cancel() or abort() that came before the loop could take it
    maybe_finish();  // nothing started at all (every spawn failed)

    {
      // Every write of the loop (a stacks answer to a client that left, a pipe) fails with
      // EPIPE instead of raising SIGPIPE in a program that embeds libairhost (base/sigpipe.hpp).
      detail::SigpipeGuard no_sigpipe;
      uv_run(&loop, UV_RUN_DEFAULT);
    }
    // What the reader has not taken yet gets a moment more (the run's last lines); a reader
    // that takes nothing at all does not keep the run, nor the summary, waiting.
    plan.out->drain(kFinalDrain);
    escapees.reap_after_run();
    uv_loop_close(&loop);
    return report();
  }
};

Supervisor::Supervisor(Plan plan, std::unique_ptr<RankStarter> starter)
    : impl_(std::make_unique<Impl>(std::move(plan), std::move(starter))) {}

Supervisor::~Supervisor() = default;

void Supervisor::abort(const std::string& why, bool timed_out, bool hung) {
  std::lock_guard lock(impl_->async_mutex);
  if (impl_->abort_why.empty()) impl_->abort_why = why, impl_->abort_timed_out = timed_out, impl_->abort_hung = hung;
  impl_->abort_pending.store(true);
  if (impl_->async_ready) uv_async_send(&impl_->async);
  // Otherwise run() has not reached its loop yet and picks it up before it does.
}

RunReport Supervisor::run() { return impl_->run(); }

void Supervisor::stacks_asked(unsigned seq, const std::string& only) {
  Impl* self = impl_.get();
  self->post([self, seq, only] { self->guarded("answering node 0's request for stacks", [&] { self->answer_stacks_ask(seq, only); }); });
}

void Supervisor::stacks_answered(int node, unsigned seq, const std::string& ranks) {
  Impl* self = impl_.get();
  self->post([self, node, seq, ranks] {
    self->guarded("taking another node's stacks", [&] {
      if (!self->stacks) return;
      try {
        self->stacks->take_answer(node, seq, decode_rank_stacks(ranks));
      } catch (const FrameError& e) {
        self->plan.out->log("node " + std::to_string(node) + "'s stacks could not be read: " + e.what());
      }
    });
  });
}

void Supervisor::cancel(int sig) noexcept {
  impl_->cancel_signal.store(sig ? sig : SIGINT);
  std::lock_guard lock(impl_->async_mutex);
  if (impl_->async_ready) uv_async_send(&impl_->async);
  // Otherwise run() has not reached its loop yet and picks the signal up before it does.
}

}  // namespace airhost::detail
