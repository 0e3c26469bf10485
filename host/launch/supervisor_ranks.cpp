// supervisor_ranks.cpp — each rank's life in one attempt: its start (pipes, control channel, the
// starter), its exit and how it settles the run's outcome, and the teardown that stops the
// others (SIGTERM to each group, SIGKILL at the grace period's end); cancel() and abort() from
// other threads arrive here through the loop's async handle.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "launch/supervisor_state.hpp"

namespace airhost::detail {

void Supervisor::Impl::make_pipe(UniqueFd& read_end, UniqueFd& write_end, const char* what) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) < 0)
    throw std::system_error(errno, std::generic_category(), std::string("cannot create a rank's ") + what + " pipe");
  read_end.reset(fds[0]);
  write_end.reset(fds[1]);
}

void Supervisor::Impl::start_rank(Rank& r) {
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

void Supervisor::Impl::ranks_changed() {
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

void Supervisor::Impl::on_start_failed(Rank& r, const std::exception& e) {
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

void Supervisor::Impl::on_exit(Rank& r, int64_t status, int sig) {
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

void Supervisor::Impl::settle(Rank& r) {
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

void Supervisor::Impl::stop_after_failure(int failed_rank) {
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

void Supervisor::Impl::maybe_closed(Rank& r) {
  if (r.life != Life::exited || output->any_open(r.report.local_rank) || r.ctl.is_open()) return;
  r.life = Life::closed;
  uv_timer_stop(&r.drain);
  maybe_finish();
}

void Supervisor::Impl::signal_running(int sig) {
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

void Supervisor::Impl::begin_teardown(Outcome reason, int sig, bool stop) {
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

void Supervisor::Impl::stop_ranks(int sig) {
  if (phase == Phase::finished) return;
  signal_running(sig);
  const auto grace = static_cast<uint64_t>(std::max<int64_t>(0, spec().grace.count()));
  uv_timer_start(&grace_timer, [](uv_timer_t* t) {
    auto* self = static_cast<Impl*>(t->data);
    self->guarded("the grace period's end", [&] { self->signal_running(SIGKILL); });
  }, grace, 0);
}

void Supervisor::Impl::on_async() {
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

void Supervisor::Impl::post(std::function<void()> work) {
  std::lock_guard lock(async_mutex);
  posted.push_back(std::move(work));
  if (async_ready) uv_async_send(&async);
}

}  // namespace airhost::detail
