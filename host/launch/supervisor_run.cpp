// supervisor_run.cpp — one attempt from its start to its end: the host's signals during it, what
// watches it (stacks, hang, usage), the guard that outlives a SIGKILLed host, the ranks' output,
// then run(): its handles, every rank spawned, the loop until every rank closed.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "launch/supervisor_state.hpp"

namespace airhost::detail {

void Supervisor::Impl::on_signal(int sig) {
  if (sig == SIGUSR1 || sig == SIGUSR2)
    guarded("passing a signal on", [&] { forward_warning(sig); });
  else if (sig == SIGQUIT)
    guarded("showing the ranks' stacks", [&] { watches->show_stacks(""); });
  else
    guarded("handling a signal", [&] { begin_teardown(Outcome::interrupted, sig); });
}

namespace {
constexpr std::uint64_t kWarningRetryMs = 20, kWarningWaitMs = 30000;
}  // namespace

void Supervisor::Impl::forward_warning(int sig) {
  const bool first = warning_signal == 0;
  warning_signal = sig;
  int sent = 0;
  for (auto& r : ranks) {
    if (r->report.state != RankState::running || r->report.pid <= 0) continue;
    if (!takes_signal(r->report.pid, sig)) {
      warning_pending.insert(r.get());
      ++sent;
    } else if (::kill(r->report.pid, sig) == 0) {
      ++sent;
    }
  }
  if (!warning_pending.empty() && !uv_is_active(as_handle(&warning_timer))) {
    warning_pending_since = uv_now(&loop);
    uv_timer_start(&warning_timer, [](uv_timer_t* t) {
      auto* self = static_cast<Impl*>(t->data);
      self->guarded("passing a signal on", [&] { self->pass_pending_warnings(); });
    }, kWarningRetryMs, kWarningRetryMs);
  }
  const std::string name = signal_name(sig);
  const std::string starting =
      warning_pending.empty() ? "" : " (" + std::to_string(warning_pending.size()) + " still starting: once it can take it)";
  if (first)
    plan.out->say(name + ": the scheduler's warning that the job's time is nearly up; passed to " +
                  std::to_string(sent) + " rank(s)" + starting + ": checkpoint and stop (airhost.preemption_requested())");
  else
    plan.out->log(name + " again; passed to " + std::to_string(sent) + " rank(s)" + starting);
}

void Supervisor::Impl::pass_pending_warnings() {
  const bool waited_enough = uv_now(&loop) - warning_pending_since >= kWarningWaitMs;
  for (auto it = warning_pending.begin(); it != warning_pending.end();) {
    Rank& r = **it;
    const bool gone = r.report.state != RankState::running || r.report.pid <= 0;
    if (gone || waited_enough || takes_signal(r.report.pid, warning_signal)) {
      if (!gone) ::kill(r.report.pid, warning_signal);
      it = warning_pending.erase(it);
    } else {
      ++it;
    }
  }
  if (warning_pending.empty()) uv_timer_stop(&warning_timer);
}

void Supervisor::Impl::make_watches() {
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

void Supervisor::Impl::start_guard() {
  std::vector<std::string> guard_env;
  for (const auto& e : plan.base_env)
    if (e.rfind("AIRHOST_RUN_ID=", 0) != 0 && e.rfind("AIRHOST_RUN_DIR=", 0) != 0) guard_env.push_back(e);
  guard_env.push_back("AIRHOST_RUN_ID=" + plan.context.run_id);
  guard_env.push_back("AIRHOST_RUN_DIR=" + plan.context.run_dir);
  guard.start(&loop, plan.rank_argv.at(0), guard_env);
}

void Supervisor::Impl::make_ranks() {
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

RunReport Supervisor::Impl::run() {
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
    uv_timer_init(&loop, &warning_timer);
    record_timer.data = warning_timer.data = this;
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

}  // namespace airhost::detail
