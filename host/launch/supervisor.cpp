// supervisor.cpp — one attempt's loop: its two state machines (the run's Phase, each rank's
// Life) and run(). What the loop watches lives in rooms of its own: the ranks' output in
// output/rank_output, their control channels in rank/control_channel, the stacks, the hang
// watch and the usage in watch/run_watches, the host's signals in procs/signal_watch.
#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <mutex>
#include <system_error>

#include "base/sigpipe.hpp"
#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/output/rank_output.hpp"
#include "launch/procs/escapees.hpp"
#include "launch/procs/group_guard.hpp"
#include "launch/procs/signal_watch.hpp"
#include "launch/rank/control_channel.hpp"
#include "launch/rank/frames.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/run/run_report.hpp"
#include "launch/watch/run_watches.hpp"

namespace airhost::detail {
namespace {

// How long pipes may stay open after their rank exited: a grandchild (a DataLoader worker,
// say) can hold them. Its process group is killed at exit, so this is only a safety net.
constexpr uint64_t kDrainMs = 3000;

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

  struct Rank {
    Impl* sup = nullptr;
    Life life = Life::waiting;
    bool stopped_by_us = false;  // reached `stopping` before it exited
    // Its exit as reaped, kept until the outcome is decided (settle): the error frame comes on
    // the control channel and the exit on another descriptor, in no set order.
    int64_t exit_status = 0;
    int exit_signal = 0;
    bool settled = false;
    RankReport report;  // report.local_rank is its index in the RankOutput too
    ControlChannel ctl;
    bool stacks_watch = false;   // it reads stacks requests on its control channel (FrameKind::stacks_watch)
    uv_timer_t drain{};          // from `exited`: closes what is still open after kDrainMs

    bool alive() const { return life == Life::running || life == Life::stopping; }

    Rank() = default;
    Rank(const Rank&) = delete;
    Rank& operator=(const Rank&) = delete;
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
  SignalWatch signals;  // the host's signals, for the run (on_signal)
  int warning_signal = 0;  // the last SIGUSR1/SIGUSR2 passed to the ranks
  // Their stdout and stderr: into the logs, the console and the callbacks (rank_output.hpp).
  std::unique_ptr<RankOutput> output;
  // The stacks, the hang watch, the usage and the flight recorder (run_watches.hpp).
  std::unique_ptr<RunWatches> watches;
  std::string hang_seen;  // the hang report's first line, once a hang was seen
  uv_timer_t record_timer{};  // plan.on_ranks_changed, a moment after the ranks changed

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
  std::string read_buffer = std::string(256 * 1024, '\0');  // every read of the loop: output and control channels

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
      if (output) output->end_open_lines();  // the note gets a line of its own
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
  bool on_rank_event_broken = false;

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

  // ---- output ------------------------------------------------------------------------

  // The host shows the ranks' own output in RankOutput; here, what the ranks' ends need of it.
  // The host's stdout and stderr are written by threads of their own (plan.out, for the whole
  // run); what the reader has not taken when the run ends gets this long.
  static constexpr auto kFinalDrain = std::chrono::seconds(2);

  void note(Rank& r, const std::string& text) { output->note(r.report.local_rank, text); }

  void on_frame(Rank& r, Frame&& f) {
    switch (static_cast<FrameKind>(f.kind)) {
      case FrameKind::result:
        r.report.result = std::move(f.payload);
        r.report.result_blob.reset();
        break;
      case FrameKind::result_fd: {
        const int fd = r.ctl.take_passed_fd();
        if (fd < 0) {
          note(r, "the rank announced a result in a descriptor but sent none; no result");
          break;
        }
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

  // Takes `fd` over; the channel closes it after its poll handle is closed.
  void open_control(Rank& r, UniqueFd fd) {
    ControlChannel::Events e;
    e.frame = [this, &r](Frame&& f) { on_frame(r, std::move(f)); };
    e.broken = [this, &r](const std::string& why) { fail_channel(r, why); };
    e.note = [this, &r](const std::string& text) { note(r, text); };
    e.closing = [this, &r] { settle(r); };
    e.closed = [this, &r] { maybe_closed(r); };
    e.guarded = [this](const char* where, const std::function<void()>& body) { guarded(where, body); };
    r.ctl.open(&loop, std::move(fd), &read_buffer, std::move(e));
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
    output->open(r.report.local_rank, 1, std::move(out_r));
    output->open(r.report.local_rank, 2, std::move(err_r));
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
        for (auto& r : self->ranks) now.push_back(live_record(r->report));
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
    output->close(r.report.local_rank, 1);
    output->close(r.report.local_rank, 2);
    r.ctl.close();
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
        rk->sup->output->close(rk->report.local_rank, 1);
        rk->sup->output->close(rk->report.local_rank, 2);
        rk->ctl.close();
      });
    }, kDrainMs, 0);
    if (!r.ctl.is_open()) settle(r);
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
    if (phase != Phase::running || cause.torn_down || !watches->has_stacks() || !others) {
      begin_teardown(Outcome::failed, SIGTERM);
      return;
    }
    failure_stacks_pending = true;
    begin_teardown(Outcome::failed, SIGTERM, false);
    watches->show_stacks("rank " + std::to_string(failed_rank) + " failed: where the other ranks are, before they are stopped",
                [this] { stop_ranks(SIGTERM); });
  }

  // exited → closed, once its three pipes are closed.
  void maybe_closed(Rank& r) {
    if (r.life != Life::exited || output->any_open(r.report.local_rank) || r.ctl.is_open()) return;
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
    const std::string why = reason == Outcome::timed_out && !cause.hang.empty() ? "hung: " + cause.hang
                            : reason == Outcome::timed_out ? "timed out (--timeout " + std::to_string(spec().timeout.count()) + " s)"
                            : reason == Outcome::interrupted ? "was interrupted by " + signal_name(sig)
                            : reason == Outcome::node_lost   ? "stopped its ranks (" + cause.node_lost_why + ")"
                            : teardown_why.empty()           ? std::string("failed")
                                                             : teardown_why;
    // The host log says when the end began, and why (the summary comes once the ranks are gone).
    plan.out->log("stopping the ranks: " + (reason == Outcome::node_lost ? cause.node_lost_why : "the run " + why));
    // The live record says which rank failed before the other nodes hear of it: they end at
    // once, and a scheduler that then kills this node (srun --kill-on-bad-exit) must not take
    // the record of the failure with it.
    if (plan.on_ranks_changed) {
      uv_timer_stop(&record_timer);
      guarded("recording the ranks", [&] {
        std::vector<RankReport> now;
        for (auto& r : ranks) now.push_back(live_record(r->report));
        plan.on_ranks_changed(now);
      });
    }
    if (plan.on_teardown)
      plan.on_teardown(reason, why, reason == Outcome::node_lost || (reason == Outcome::failed && teardown_cascade),
                       reason == Outcome::timed_out && !cause.hang.empty());
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
    output->finish();
    uv_close(as_handle(&alive_timer), nullptr);
    uv_close(as_handle(&record_timer), nullptr);  // the final record is the launcher's
    if (escapees_told) escapees.kill_all();  // what a teardown signal did not end by now
    escapees.close();
    watches->close();
    signals.close();
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
    rep.incomplete_logs = output->incomplete_logs();
    rep.trimmed_logs = output->trimmed_logs();
    std::vector<bool> signalled;
    for (auto& r : ranks) {
      rep.ranks.push_back(r->report);
      signalled.push_back(r->stopped_by_us);
    }
    conclude_run(rep, cause, signalled);
    return rep;
  }

  // ---- the run -------------------------------------------------------------------------

  // SIGUSR1 and SIGUSR2 end nothing: a scheduler's warning that the job's time is nearly up
  // (Slurm's --signal=USR1@90), passed to every rank to checkpoint on (forward_warning). Nor
  // does SIGQUIT (Ctrl-\): it prints every rank's stacks and the run goes on.
  void on_signal(int sig) {
    if (sig == SIGUSR1 || sig == SIGUSR2)
      guarded("passing a signal on", [&] { forward_warning(sig); });
    else if (sig == SIGQUIT)
      guarded("showing the ranks' stacks", [&] { watches->show_stacks(""); });
    else
      guarded("handling a signal", [&] { begin_teardown(Outcome::interrupted, sig); });
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

  void make_watches() {
    RunWatches::Options o;
    o.loop = &loop;
    o.spec = plan.spec;
    o.context = plan.context;
    o.say = [this](std::string_view line) { plan.out->say(line); };
    o.log = [this](std::string_view line) { plan.out->log(line); };
    o.ask_nodes = plan.ask_stacks;
    o.answer_stacks = plan.answer_stacks;
    RunWatches::Host h;
    h.ranks = [this] {
      std::vector<StacksService::Rank> list;
      for (auto& r : ranks)
        list.push_back({r->report.rank, r->report.local_rank, r->report.pid, r->alive() && r->report.pid > 0,
                        r->stacks_watch && r->ctl.is_open() ? r->ctl.fd() : -1});
      return list;
    };
    h.running = [this] { return phase == Phase::running; };
    h.guarded = [this](const char* where, const std::function<void()>& body) { guarded(where, body); };
    h.end_open_lines = [this] { output->end_open_lines(); };
    h.hang_seen = [this](const std::string& headline, bool stops) {
      hang_seen = headline;
      if (stops) cause.hang = headline;
    };
    h.stop_timed_out = [this] { begin_teardown(Outcome::timed_out, SIGTERM); };
    watches = std::make_unique<RunWatches>(std::move(o), std::move(h));
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
    RankOutput::Options o;
    o.loop = &loop;
    o.output = &spec().output;
    o.callbacks = plan.callbacks;
    o.out = plan.out;
    o.buffer = &read_buffer;
    RankOutput::Host h;
    h.guarded = [this](const char* where, const std::function<void()>& body) { guarded(where, body); };
    h.callback_failed = [this](const char* name, const std::string& what) { host_failure(name, what); };
    h.live_pid = [this](int index) {
      const Rank& r = *ranks.at(static_cast<std::size_t>(index));
      return r.alive() ? static_cast<int>(r.report.pid) : 0;
    };
    h.closed = [this](int index) { maybe_closed(*ranks.at(static_cast<std::size_t>(index))); };
    output = std::make_unique<RankOutput>(std::move(o), std::move(h));
    const int nprocs = spec().nprocs;
    for (int i = 0; i < nprocs; ++i) {
      auto r = std::make_unique<Rank>();
      r->sup = this;
      r->report.local_rank = i;
      r->report.rank = spec().node_rank * nprocs + i;
      const std::string base = plan.context.run_dir + "/logs/rank-" + std::to_string(r->report.rank);
      r->report.stdout_log = base + ".stdout.log";
      r->report.stderr_log = base + ".stderr.log";
      output->add_rank(r->report.rank, rank_prefix(r->report.rank), r->report.stdout_log, r->report.stderr_log);
      ranks.push_back(std::move(r));
    }
  }

  RunReport run() {
    start_time = now_seconds();
    if (int rc = uv_loop_init(&loop); rc < 0)
      throw std::system_error(-rc, std::generic_category(), "uv_loop_init");
    // What the attempt needs before a rank starts (timers, signals, pipes, sockets): should the
    // system refuse one (no descriptor left), every handle made so far is closed before the
    // error goes up to the launcher, so that no libuv handle outlives this object (a signal
    // handle left registered would be called into freed memory).
    try {
      uv_timer_init(&loop, &timeout_timer);
      uv_timer_init(&loop, &grace_timer);
      uv_timer_init(&loop, &alive_timer);
      uv_timer_init(&loop, &record_timer);
      record_timer.data = this;
      timeout_timer.data = grace_timer.data = alive_timer.data = this;
      make_watches();
      if (plan.on_alive) {
        plan.on_alive();
        const auto every = static_cast<std::uint64_t>(std::max<long long>(plan.alive_every.count(), 1));
        uv_timer_start(&alive_timer, [](uv_timer_t* t) {
          auto* self = static_cast<Impl*>(t->data);
          self->guarded("the loop's heartbeat", [&] { self->plan.on_alive(); });
        }, every, every);
      }
      uv_async_init(&loop, &async, [](uv_async_t* a) {
        auto* self = static_cast<Impl*>(a->data);
        self->guarded("handling cancel() or abort()", [&] { self->on_async(); });
      });
      async.data = this;
      {
        std::lock_guard lock(async_mutex);
        async_ready = true;
      }
      if (spec().handle_signals) signals.start(&loop, [this](int sig) { on_signal(sig); });
      escapees.start(&loop, &guard, plan.context.run_id, spec().reap_orphans, [this] {
        std::set<int> pids;
        for (auto& r : ranks)
          if (r->alive()) pids.insert(r->report.pid);
        return pids;
      });
      start_guard();
      make_ranks();
      watches->start_stacks();
    } catch (...) {
      {
        std::lock_guard lock(async_mutex);
        async_ready = false;  // cancel() from another thread finds no handle to wake
      }
      uv_walk(&loop, [](uv_handle_t* h, void*) {
        if (!uv_is_closing(h)) uv_close(h, nullptr);
      }, nullptr);
      uv_run(&loop, UV_RUN_DEFAULT);
      uv_loop_close(&loop);
      throw;
    }

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
          self->watches->at_timeout([self] { self->begin_teardown(Outcome::timed_out, SIGTERM); });
        });
      }, static_cast<uint64_t>(plan.time_limit.count()), 0);
    }
    watches->start_timers();
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
  self->post([self, seq, only] {
    self->guarded("answering node 0's request for stacks", [&] { self->watches->answer_stacks_ask(seq, only); });
  });
}

void Supervisor::stacks_answered(int node, unsigned seq, const std::string& ranks) {
  Impl* self = impl_.get();
  self->post([self, node, seq, ranks] {
    self->guarded("taking another node's stacks", [&] { self->watches->take_answer(node, seq, ranks); });
  });
}

void Supervisor::cancel(int sig) noexcept {
  impl_->cancel_signal.store(sig ? sig : SIGINT);
  std::lock_guard lock(impl_->async_mutex);
  if (impl_->async_ready) uv_async_send(&impl_->async);
  // Otherwise run() has not reached its loop yet and picks the signal up before it does.
}

}  // namespace airhost::detail
