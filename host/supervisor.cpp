#include "supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <system_error>

#include "airhost/exit_code.hpp"
#include "frames.hpp"
#include "group_guard.hpp"
#include "log_stream.hpp"
#include "util.hpp"

namespace airhost::detail {
namespace {

// How long pipes may stay open after their rank exited: a grandchild (a DataLoader worker,
// say) can hold them. Its process group is killed at exit, so this is only a safety net.
constexpr uint64_t kDrainMs = 3000;

template <typename H>
uv_handle_t* as_handle(H* h) { return reinterpret_cast<uv_handle_t*>(h); }

}  // namespace

bool is_lost_peer_error(const ErrorRecord& e) {
  if (e.type.ends_with("DistNetworkError")) return true;
  for (const char* words : {"Connection closed by peer", "Connection reset by peer", "remote worker crashing",
                            "NCCL communicator was aborted", "Broken pipe"})
    if (e.message.find(words) != std::string::npos) return true;
  return false;
}

struct Supervisor::Impl {
  struct Rank;

  // One pipe from a rank: stdout, stderr or the control channel.
  struct Channel {
    Rank* rank = nullptr;
    int which = 0;  // 1 stdout, 2 stderr, 3 control
    uv_pipe_t pipe{};
    bool open = false;
  };

  struct Rank {
    Impl* sup = nullptr;
    RankReport report;
    Channel out, err, ctl;
    std::unique_ptr<RankStream> out_stream, err_stream;
    FrameDecoder frames;
    bool exited = false;
    bool signalled = false;  // airhost sent it a teardown signal
    uv_timer_t drain{};
    bool drain_started = false;
  };

  Plan plan;
  std::unique_ptr<RankStarter> starter;
  uv_loop_t loop{};
  GroupGuard guard;
  std::vector<std::unique_ptr<Rank>> ranks;
  uv_timer_t timeout_timer{}, grace_timer{};
  uv_signal_t signals[3]{};
  int signal_count = 0;
  uv_async_t async{};
  std::atomic<int> cancel_signal{0};
  std::atomic<bool> abort_pending{false};
  std::string abort_why;      // guarded by async_mutex until the loop reads it
  std::string node_lost_why;  // the loop's copy
  std::string teardown_cause; // for plan.on_teardown: what made a rank fail
  bool teardown_cascade = false;
  std::mutex async_mutex;  // guards async_ready: cancel() may race the loop's start and end
  bool async_ready = false;
  bool finishing = false;

  bool tearing_down = false;
  double teardown_started_at = std::numeric_limits<double>::infinity();
  Outcome teardown_reason = Outcome::succeeded;
  int interrupt_signal = 0;
  double start_time = 0;
  std::string read_buffer = std::string(64 * 1024, '\0');
  std::string line_buffer;

  Impl(Plan p, std::unique_ptr<RankStarter> s) : plan(std::move(p)), starter(std::move(s)) {}

  const LaunchSpec& spec() const { return *plan.spec; }

  // ---- output --------------------------------------------------------------------------

  void on_line(Rank& r, Stream stream, std::string_view line) {
    const auto& cb = plan.callbacks->on_output;
    if (cb) cb(r.report.rank, stream, line);
    const auto& out = spec().output;
    if (!out.forward || (!out.ranks.empty() && !out.ranks.count(r.report.rank))) return;
    line_buffer.clear();
    if (out.prefix) line_buffer += rank_prefix(r.report.rank);
    line_buffer += line;
    line_buffer += '\n';
    // One write per line from this single thread: lines of different ranks never interleave.
    write_all(stream == Stream::out ? STDOUT_FILENO : STDERR_FILENO, line_buffer);
  }

  void on_frame(Rank& r, Frame&& f) {
    switch (static_cast<FrameKind>(f.kind)) {
      case FrameKind::result:
        r.report.result = std::move(f.payload);
        break;
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
      default:
        break;  // kinds newer than this host: skipped by design
    }
  }

  void on_read(Channel& c, ssize_t nread, const uv_buf_t* buf) {
    Rank& r = *c.rank;
    if (nread > 0) {
      std::string_view bytes(buf->base, static_cast<std::size_t>(nread));
      if (c.which == 1) r.out_stream->feed(bytes);
      else if (c.which == 2) r.err_stream->feed(bytes);
      else {
        try {
          r.frames.feed(bytes);
          while (auto f = r.frames.next()) on_frame(r, std::move(*f));
        } catch (const FrameError& e) {
          r.err_stream->feed(std::string("airhost: ") + e.what() + "; ignoring the rest of it\n");
          close_channel(c);
        }
      }
      return;
    }
    if (nread < 0) close_channel(c);  // UV_EOF or an error: either way this pipe is done
  }

  void close_channel(Channel& c) {
    if (!c.open) return;
    c.open = false;
    Rank& r = *c.rank;
    if (c.which == 1) r.out_stream->finish();
    if (c.which == 2) r.err_stream->finish();
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.pipe));
    uv_close(as_handle(&c.pipe), [](uv_handle_t* h) {
      auto* ch = static_cast<Channel*>(h->data);
      ch->rank->sup->maybe_finish();
    });
  }

  void open_channel(Rank& r, Channel& c, int which, int fd) {
    c.rank = &r;
    c.which = which;
    uv_pipe_init(&loop, &c.pipe, 0);
    c.pipe.data = &c;
    uv_pipe_open(&c.pipe, fd);
    c.open = true;
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(&c.pipe),
        [](uv_handle_t* h, size_t, uv_buf_t* buf) {
          auto* sup = static_cast<Channel*>(h->data)->rank->sup;
          *buf = uv_buf_init(sup->read_buffer.data(), static_cast<unsigned>(sup->read_buffer.size()));
        },
        [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
          auto* ch = static_cast<Channel*>(s->data);
          ch->rank->sup->on_read(*ch, n, buf);
        });
  }

  // ---- processes -----------------------------------------------------------------------

  void start_rank(Rank& r) {
    int out[2], err[2], ctl[2];
    if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(err, O_CLOEXEC) < 0 ||
        ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0)
      throw std::system_error(errno, std::generic_category(), "cannot create the pipes of a rank");

    RankStartRequest req;
    req.local_rank = r.report.local_rank;
    req.argv = plan.rank_argv;
    req.env = build_rank_env(spec(), r.report.local_rank, plan.context, plan.base_env);
    req.cwd = spec().working_dir;
    req.stdout_fd = out[1];
    req.stderr_fd = err[1];
    req.control_fd = ctl[1];

    open_channel(r, r.out, 1, out[0]);
    open_channel(r, r.err, 2, err[0]);
    open_channel(r, r.ctl, 3, ctl[0]);
    try {
      r.report.pid = starter->start(&loop, req, [this, &r](int64_t status, int sig) { on_exit(r, status, sig); });
      guard.add(r.report.pid);
    } catch (...) {
      ::close(out[1]);
      ::close(err[1]);
      ::close(ctl[1]);
      throw;
    }
    // Our copies of the child ends must go, or the pipes would never reach EOF.
    ::close(out[1]);
    ::close(err[1]);
    ::close(ctl[1]);
    r.report.state = RankState::running;
    r.report.started_at = now_seconds();
    if (plan.callbacks->on_rank_event)
      plan.callbacks->on_rank_event({RankEvent::Kind::started, r.report.rank, r.report.pid, 0, 0});
  }

  void on_exit(Rank& r, int64_t status, int sig) {
    r.exited = true;
    r.report.ended_at = now_seconds();
    r.report.exit_code = sig ? -1 : static_cast<int>(status);
    r.report.term_signal = sig;
    // Whatever the rank left behind in its process group (workers, daemons) goes with it.
    ::kill(-r.report.pid, SIGKILL);
    guard.remove(r.report.pid);

    const bool ok = sig == 0 && status == 0;
    // A rank that raised before the teardown began is a failure even if our signal is what
    // finally ended it (slow atexit handlers): it may well be the root cause.
    const bool raised_first = r.report.error && r.report.error->time <= teardown_started_at;
    if (ok) r.report.state = RankState::succeeded;
    else if (r.signalled && !raised_first) r.report.state = RankState::stopped;
    else r.report.state = RankState::failed;

    if (plan.callbacks->on_rank_event)
      plan.callbacks->on_rank_event({RankEvent::Kind::exited, r.report.rank, r.report.pid, r.report.exit_code, sig});

    if (!ok && !r.signalled && !tearing_down) {
      teardown_cause = "failed: rank " + std::to_string(r.report.rank) +
                       (sig ? " was killed by " + signal_name(sig) : " exited with code " + std::to_string(status));
      if (r.report.error) {
        const auto& m = r.report.error->message;
        teardown_cause += " (" + r.report.error->type + ": " + m.substr(0, std::min(m.find('\n'), std::size_t{200})) + ")";
        teardown_cascade = is_lost_peer_error(*r.report.error);
      }
    }
    if (!ok && !r.signalled) begin_teardown(Outcome::failed, SIGTERM);

    uv_timer_init(&loop, &r.drain);
    r.drain.data = &r;
    r.drain_started = true;
    uv_timer_start(&r.drain, [](uv_timer_t* t) {
      auto* rk = static_cast<Rank*>(t->data);
      rk->sup->close_channel(rk->out);
      rk->sup->close_channel(rk->err);
      rk->sup->close_channel(rk->ctl);
    }, kDrainMs, 0);
    maybe_finish();
  }

  void signal_running(int sig) {
    for (auto& r : ranks) {
      if (r->report.state != RankState::running || r->exited) continue;
      r->signalled = true;
      ::kill(-r->report.pid, sig);
    }
  }

  void begin_teardown(Outcome reason, int sig) {
    if (tearing_down) {
      // A second Ctrl-C means "now": skip the rest of the grace period.
      if (reason == Outcome::interrupted) signal_running(SIGKILL);
      return;
    }
    tearing_down = true;
    teardown_started_at = now_seconds();
    teardown_reason = reason;
    if (reason == Outcome::interrupted) interrupt_signal = sig;
    if (plan.on_teardown) {
      std::string why = reason == Outcome::timed_out     ? "timed out (--timeout " + std::to_string(spec().timeout.count()) + " s)"
                        : reason == Outcome::interrupted ? "was interrupted by " + signal_name(sig)
                        : reason == Outcome::node_lost   ? "stopped its ranks (" + node_lost_why + ")"
                        : teardown_cause.empty()         ? std::string("failed")
                                                         : teardown_cause;
      plan.on_teardown(reason, why, reason == Outcome::node_lost || (reason == Outcome::failed && teardown_cascade));
    }
    signal_running(sig);
    const auto grace = static_cast<uint64_t>(std::max<int64_t>(0, spec().grace.count()));
    uv_timer_start(&grace_timer, [](uv_timer_t* t) {
      static_cast<Impl*>(t->data)->signal_running(SIGKILL);
    }, grace, 0);
  }

  // Another node is gone (abort()): stop this node's ranks as Outcome::node_lost.
  void take_abort() {
    if (!abort_pending.exchange(false)) return;
    {
      std::lock_guard lock(async_mutex);
      if (node_lost_why.empty()) node_lost_why = abort_why;
    }
    begin_teardown(Outcome::node_lost, SIGTERM);
  }

  // ---- completion ----------------------------------------------------------------------

  bool all_done() const {
    for (auto& r : ranks)
      if (r->report.state == RankState::running || r->out.open || r->err.open || r->ctl.open) return false;
    return true;
  }

  void maybe_finish() {
    if (finishing || !all_done()) return;
    finishing = true;
    uv_close(as_handle(&timeout_timer), nullptr);
    uv_close(as_handle(&grace_timer), nullptr);
    for (int i = 0; i < signal_count; ++i) uv_close(as_handle(&signals[i]), nullptr);
    {
      std::lock_guard lock(async_mutex);
      async_ready = false;
      uv_close(as_handle(&async), nullptr);
    }
    for (auto& r : ranks)
      if (r->drain_started) uv_close(as_handle(&r->drain), nullptr);
    starter->close();
    guard.stop();
  }

  RunReport report() {
    RunReport rep;
    rep.run_id = plan.context.run_id;
    rep.run_dir = plan.context.run_dir;
    rep.wall_seconds = now_seconds() - start_time;
    rep.interrupt_signal = interrupt_signal;
    for (auto& r : ranks) rep.ranks.push_back(r->report);

    // The root cause is the earliest failure: the time its exception was caught, or its
    // exit when it raised none (a segfault, os._exit). Cascading failures come later, with
    // one exception: a peer's death reaches the other ranks' sockets at once, while we learn
    // of it only when SIGCHLD is handled, so "connection closed by peer" can carry an earlier
    // time than the crash that caused it. Such errors are the root cause only when nothing
    // else failed.
    double earliest = std::numeric_limits<double>::infinity();
    bool earliest_is_cascade = true;
    for (auto& r : rep.ranks) {
      if (r.state != RankState::failed) continue;
      const double t = r.error ? std::min(r.error->time, r.ended_at) : r.ended_at;
      const bool cascade = r.error && is_lost_peer_error(*r.error);
      if ((earliest_is_cascade && !cascade) || (cascade == earliest_is_cascade && t < earliest)) {
        earliest = t;
        earliest_is_cascade = cascade;
        rep.root_cause = r.rank;
      }
    }

    const std::string run = "run " + rep.run_id;
    if (!tearing_down) {
      rep.outcome = Outcome::succeeded;
      rep.exit_code = to_int(ExitCode::ok);
      rep.message = run + ": " + std::to_string(rep.ranks.size()) + " rank(s) succeeded";
    } else if (teardown_reason == Outcome::timed_out) {
      rep.outcome = Outcome::timed_out;
      rep.exit_code = to_int(ExitCode::timeout);
      rep.message = run + " timed out after " + std::to_string(spec().timeout.count()) +
                    " s; every rank was stopped (raise --timeout, or 0 to disable it)";
    } else if (teardown_reason == Outcome::node_lost) {
      // Whatever this node's ranks raised after that came from the other node's loss.
      rep.outcome = Outcome::node_lost;
      rep.exit_code = to_int(ExitCode::node_lost);
      rep.root_cause = -1;
      rep.message = run + ": " + node_lost_why + "; this node's ranks were stopped";
    } else if (teardown_reason == Outcome::interrupted) {
      rep.outcome = Outcome::interrupted;
      rep.exit_code = exit_code_for_signal(interrupt_signal);
      rep.message = run + " was interrupted by " + signal_name(interrupt_signal) + "; every rank was stopped";
    } else {
      rep.outcome = Outcome::failed;
      const RankReport* root = nullptr;
      for (auto& r : rep.ranks)
        if (r.rank == rep.root_cause) root = &r;
      if (root) {
        // A rank that raised but was ended by our own teardown signal (its interpreter was
        // still shutting down) exits as python does for an unhandled exception: 1.
        const bool our_signal = root->term_signal && root->error && ranks[root->local_rank]->signalled;
        rep.exit_code = our_signal ? 1 : root->term_signal ? exit_code_for_signal(root->term_signal) : root->exit_code;
        rep.message = run + " failed: rank " + std::to_string(root->rank) +
                      (our_signal ? " raised an exception (the teardown ended it while it shut down)"
                       : root->term_signal ? " was killed by " + signal_name(root->term_signal)
                                           : " exited with code " + std::to_string(root->exit_code));
        if (root->error) {
          const auto& m = root->error->message;
          rep.message += " (" + root->error->type + ": " + m.substr(0, std::min(m.find('\n'), std::size_t{200})) + ")";
        }
      } else {
        rep.exit_code = to_int(ExitCode::generic_failure);
        rep.message = run + " failed";
      }
    }
    return rep;
  }

  // ---- the run -------------------------------------------------------------------------

  RunReport run() {
    start_time = now_seconds();
    if (int rc = uv_loop_init(&loop); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "uv_loop_init");
    uv_timer_init(&loop, &timeout_timer);
    uv_timer_init(&loop, &grace_timer);
    timeout_timer.data = grace_timer.data = this;
    uv_async_init(&loop, &async, [](uv_async_t* a) {
      auto* self = static_cast<Impl*>(a->data);
      if (int sig = self->cancel_signal.exchange(0)) self->begin_teardown(Outcome::interrupted, sig);
      self->take_abort();
    });
    async.data = this;
    {
      std::lock_guard lock(async_mutex);
      async_ready = true;
    }

    if (spec().handle_signals) {
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
        auto& h = signals[signal_count++];
        uv_signal_init(&loop, &h);
        h.data = this;
        uv_signal_start(&h, [](uv_signal_t* s, int signum) {
          static_cast<Impl*>(s->data)->begin_teardown(Outcome::interrupted, signum);
        }, sig);
      }
    }

    // Should this process die by SIGKILL, the guard ends what the ranks started. It gets the
    // caller's environment (what airhost-rank needs to load: LD_LIBRARY_PATH, say) and the
    // run's id and directory, which name it as the run's in /proc.
    std::vector<std::string> guard_env;
    for (const auto& e : plan.base_env)
      if (e.rfind("AIRHOST_RUN_ID=", 0) != 0 && e.rfind("AIRHOST_RUN_DIR=", 0) != 0) guard_env.push_back(e);
    guard_env.push_back("AIRHOST_RUN_ID=" + plan.context.run_id);
    guard_env.push_back("AIRHOST_RUN_DIR=" + plan.context.run_dir);
    guard.start(&loop, plan.rank_argv.at(0), guard_env);

    const int nprocs = spec().nprocs;
    for (int i = 0; i < nprocs; ++i) {
      auto r = std::make_unique<Rank>();
      r->sup = this;
      r->report.local_rank = i;
      r->report.rank = spec().node_rank * nprocs + i;
      const std::string base = plan.context.run_dir + "/logs/rank-" + std::to_string(r->report.rank);
      r->report.stdout_log = base + ".stdout.log";
      r->report.stderr_log = base + ".stderr.log";
      Rank* raw = r.get();
      r->out_stream = std::make_unique<RankStream>(r->report.stdout_log, spec().output.max_line,
                                                   [this, raw](std::string_view l) { on_line(*raw, Stream::out, l); });
      r->err_stream = std::make_unique<RankStream>(r->report.stderr_log, spec().output.max_line,
                                                   [this, raw](std::string_view l) { on_line(*raw, Stream::err, l); });
      ranks.push_back(std::move(r));
    }

    for (auto& r : ranks) {
      if (tearing_down) break;
      try {
        start_rank(*r);
      } catch (const std::exception& e) {
        r->err_stream->feed(std::string("airhost: ") + e.what() + "\n");
        r->report.state = RankState::failed;
        r->report.exit_code = 127;
        r->report.ended_at = now_seconds();
        r->report.error = ErrorRecord{"LaunchError", e.what(), "", "", r->report.ended_at};
        close_channel(r->out);
        close_channel(r->err);
        close_channel(r->ctl);
        begin_teardown(Outcome::failed, SIGTERM);
      }
    }
    if (plan.time_limit.count() > 0) {
      uv_timer_start(&timeout_timer, [](uv_timer_t* t) {
        static_cast<Impl*>(t->data)->begin_teardown(Outcome::timed_out, SIGTERM);
      }, static_cast<uint64_t>(plan.time_limit.count()), 0);
    }
    if (int sig = cancel_signal.exchange(0)) begin_teardown(Outcome::interrupted, sig);
    take_abort();
    maybe_finish();  // nothing started at all (every spawn failed)

    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return report();
  }
};

Supervisor::Supervisor(Plan plan, std::unique_ptr<RankStarter> starter)
    : impl_(std::make_unique<Impl>(std::move(plan), std::move(starter))) {}

Supervisor::~Supervisor() = default;

void Supervisor::abort(const std::string& why) {
  std::lock_guard lock(impl_->async_mutex);
  if (impl_->abort_why.empty()) impl_->abort_why = why;
  impl_->abort_pending.store(true);
  if (impl_->async_ready) uv_async_send(&impl_->async);
  // Otherwise run() has not reached its loop yet and picks it up before it does.
}

RunReport Supervisor::run() { return impl_->run(); }

void Supervisor::cancel(int sig) noexcept {
  impl_->cancel_signal.store(sig ? sig : SIGINT);
  std::lock_guard lock(impl_->async_mutex);
  if (impl_->async_ready) uv_async_send(&impl_->async);
  // Otherwise run() has not reached its loop yet and picks the signal up before it does.
}

}  // namespace airhost::detail
