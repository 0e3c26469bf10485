// supervisor_state.hpp — one attempt's state (Supervisor::Impl): its two state machines, the
// run's Phase and each rank's Life, and what the loop holds. Internal to the files that hold its
// code: supervisor.cpp (the exceptions, the output, the report), supervisor_ranks.cpp (each
// rank's start, exit and teardown) and supervisor_run.cpp (the attempt's set-up and its loop).
// What the loop watches lives in rooms of its own: the ranks' output in output/rank_output, their
// control channels in rank/control_channel, the stacks, the hang watch and the usage in
// watch/run_watches, the host's signals in procs/signal_watch.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/sigpipe.hpp"
#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/output/rank_output.hpp"
#include "launch/procs/escapees.hpp"
#include "launch/procs/group_guard.hpp"
#include "launch/procs/proc_tree.hpp"
#include "launch/procs/signal_watch.hpp"
#include "launch/rank/control_channel.hpp"
#include "launch/rank/frames.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/run/run_report.hpp"
#include "launch/supervisor.hpp"
#include "launch/watch/run_watches.hpp"

namespace airhost::detail {

// How long pipes may stay open after their rank exited: a grandchild (a DataLoader worker,
// say) can hold them. Its process group is killed at exit, so this is only a safety net.
inline constexpr uint64_t kDrainMs = 3000;

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
  std::set<Rank*> warning_pending;  // running ranks the warning waits for (still starting)
  std::uint64_t warning_pending_since = 0;  // uv_now when they began waiting
  uv_timer_t warning_timer{};
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

  void host_failure(const char* where, const std::string& what) noexcept;

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
  void fail_channel(Rank& r, const std::string& why);

  // ---- output ------------------------------------------------------------------------

  // The host shows the ranks' own output in RankOutput; here, what the ranks' ends need of it.
  // The host's stdout and stderr are written by threads of their own (plan.out, for the whole
  // run); what the reader has not taken when the run ends gets this long.
  static constexpr auto kFinalDrain = std::chrono::seconds(2);

  void note(Rank& r, const std::string& text) { output->note(r.report.local_rank, text); }

  void on_frame(Rank& r, Frame&& f);

  // Takes `fd` over; the channel closes it after its poll handle is closed.
  void open_control(Rank& r, UniqueFd fd);

  // ---- processes -----------------------------------------------------------------------

  // Two pipes and a socket pair, owned until each end has its next owner: a failure half way
  // (EMFILE at the socket pair, say) closes what was already made.
  static void make_pipe(UniqueFd& read_end, UniqueFd& write_end, const char* what);

  void start_rank(Rank& r);

  // The live record (Plan::on_ranks_changed): one write for a burst of starts or exits.
  static constexpr std::uint64_t kRecordEveryMs = 50;
  void ranks_changed();

  // A rank could not be started: it failed, and so does the run.
  void on_start_failed(Rank& r, const std::exception& e);

  // running/stopping → exited: the rank was reaped. Its outcome waits for the end of its
  // control channel (settle), bounded by the drain timer.
  void on_exit(Rank& r, int64_t status, int sig);

  // exited, with every frame of its control channel read (EOF, or the drain timer gave up
  // on it): its outcome, from all the evidence whatever order it came in. A rank that raised
  // is then named with its exception even when its exit was seen first.
  void settle(Rank& r);

  // A rank failed: before the others are stopped, where each of them is, so that no run ends
  // without saying where its ranks were (a survivor waiting in all_reduce for the dead rank,
  // or one stuck elsewhere that the failure only revealed). The stacks take a few ms, 3 s at
  // most for a rank that does not answer; a rank failing meanwhile waits for the same end.
  void stop_after_failure(int failed_rank);

  // exited → closed, once its three pipes are closed.
  void maybe_closed(Rank& r);

  // running → stopping, for every rank still alive; what left the groups gets it too (all of
  // the run at once for SIGKILL).
  void signal_running(int sig);

  // → tearing_down (once): a rank failed, the timeout passed, the host got a signal, cancel()
  // or abort() was called.
  // `stop`: false when the caller signals the ranks itself a moment later (stop_after_failure);
  // the outcome is settled here either way, so a run whose ranks all end meanwhile keeps it.
  void begin_teardown(Outcome reason, int sig, bool stop = true);

  void stop_ranks(int sig);

  // From other threads, through `async`: cancel() as an interrupt, abort() as a lost node.
  void on_async();

  // Work for the loop's thread, from any thread; dropped once the loop has ended.
  void post(std::function<void()> work);

  // ---- completion ----------------------------------------------------------------------

  bool all_closed() const;

  // → finished: every rank closed. Closes the loop's own handles so that uv_run returns.
  void maybe_finish();

  RunReport report();

  // ---- the run -------------------------------------------------------------------------

  // SIGUSR1 and SIGUSR2 end nothing: a scheduler's warning that the job's time is nearly up
  // (Slurm's --signal=USR1@90), passed to every rank to checkpoint on (forward_warning). Nor
  // does SIGQUIT (Ctrl-\): it prints every rank's stacks and the run goes on.
  void on_signal(int sig);

  // The run goes on: each rank's main process gets the signal (not its group: a DataLoader
  // worker would die of it), where airhost's handler records it for
  // airhost.preemption_requested(); the training loop checkpoints and leaves. A rank still
  // starting (its process not yet past exec, where airhost-rank ignores the warning until its
  // interpreter's handler takes over) would be killed by it: it gets the signal once it takes
  // it (takes_signal), checked every kWarningRetryMs by warning_timer; a process that still
  // leaves it at its default after kWarningWaitMs gets it all the same.
  void forward_warning(int sig);
  void pass_pending_warnings();

  void make_watches();

  // Should this process die by SIGKILL, the guard ends what the ranks started. It gets the
  // caller's environment (what airhost-rank needs to load: LD_LIBRARY_PATH, say) and the
  // run's id and directory, which name it as the run's in /proc.
  void start_guard();

  void make_ranks();

  RunReport run();
};

}  // namespace airhost::detail
