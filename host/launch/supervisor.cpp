// supervisor.cpp — one attempt's exceptions (a host failure ends the attempt, never the process), its ranks'
// control frames, when it is finished and its report; and the public calls (supervisor_state.hpp
// has the state, supervisor_ranks.cpp and supervisor_run.cpp the rest of its code).
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "launch/supervisor_state.hpp"

namespace airhost::detail {

void Supervisor::Impl::host_failure(const char* where, const std::string& what) noexcept {
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

void Supervisor::Impl::fail_channel(Rank& r, const std::string& why) {
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

void Supervisor::Impl::on_frame(Rank& r, Frame&& f) {
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

void Supervisor::Impl::open_control(Rank& r, UniqueFd fd) {
  ControlChannel::Events e;
  e.frame = [this, &r](Frame&& f) { on_frame(r, std::move(f)); };
  e.broken = [this, &r](const std::string& why) { fail_channel(r, why); };
  e.note = [this, &r](const std::string& text) { note(r, text); };
  e.closing = [this, &r] { settle(r); };
  e.closed = [this, &r] { maybe_closed(r); };
  e.guarded = [this](const char* where, const std::function<void()>& body) { guarded(where, body); };
  r.ctl.open(&loop, std::move(fd), &read_buffer, std::move(e));
}

bool Supervisor::Impl::all_closed() const {
  for (auto& r : ranks)
    if (r->life != Life::closed && r->life != Life::waiting) return false;
  return phase != Phase::starting;
}

void Supervisor::Impl::maybe_finish() {
  if (phase == Phase::finished || !all_closed()) return;
  phase = Phase::finished;
  uv_close(as_handle(&timeout_timer), nullptr);
  uv_close(as_handle(&grace_timer), nullptr);
  output->finish();
  uv_close(as_handle(&alive_timer), nullptr);
  uv_close(as_handle(&record_timer), nullptr);  // the final record is the launcher's
  uv_close(as_handle(&warning_timer), nullptr);
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

RunReport Supervisor::Impl::report() {
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
