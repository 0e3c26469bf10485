#include "launch/output/rank_output.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/procs/proc_tree.hpp"

namespace airhost::detail {
namespace {

constexpr std::size_t kFlushAt = 1u << 20;
// A partial line is held this long for its end before it is shown (LiveSplitter).
constexpr std::uint64_t kQuietMs = 150;
constexpr std::uint64_t kResumeCheckMs = 5;

}  // namespace

RankOutput::RankOutput(Options options, Host host) : o_(std::move(options)), host_(std::move(host)) {
  // One terminal (or file) behind both: a line open on stdout must end before stderr writes.
  console_ = std::make_unique<Console>(same_file(STDOUT_FILENO, STDERR_FILENO));
  for (uv_timer_t* t : {&output_timer_, &resume_timer_}) {
    uv_timer_init(o_.loop, t);
    t->data = this;
  }
}

RankOutput::~RankOutput() = default;

template <typename F>
void RankOutput::user_callback(const char* name, bool& broken, F&& call) {
  if (broken) return;
  try {
    call();
  } catch (const std::exception& e) {
    broken = true;
    host_.callback_failed(name, e.what());
  } catch (...) {
    broken = true;
    host_.callback_failed(name, "an exception that is not a std::exception");
  }
}

void RankOutput::add_rank(int rank, std::string prefix, const std::string& stdout_log, const std::string& stderr_log) {
  auto p = std::make_unique<Pipes>();
  Pipes* raw = p.get();
  p->owner = this;
  p->index = static_cast<int>(ranks_.size());
  p->rank = rank;
  p->prefix = std::move(prefix);
  p->out.pipes = p->err.pipes = raw;
  p->out.which = 1;
  p->err.which = 2;
  auto make_stream = [&](const std::string& log, Stream stream) {
    RankStream::OnLine lines;  // split into lines only for a caller that asks for them
    if (o_.callbacks->on_output)
      lines = [this, raw, stream](std::string_view l) {
        const auto& cb = o_.callbacks->on_output;
        user_callback("the on_output callback", on_output_broken_, [&] { cb(raw->rank, stream, l); });
      };
    return std::make_unique<RankStream>(log, o_.output->max_line, kQuietMs, std::move(lines),
                                        [this, raw, stream](const ConsoleEvent& e) { on_show(*raw, stream, e); },
                                        o_.output->log_max_bytes);
  };
  p->out_stream = make_stream(stdout_log, Stream::out);
  p->err_stream = make_stream(stderr_log, Stream::err);
  ranks_.push_back(std::move(p));
}

void RankOutput::on_show(Pipes& p, Stream stream, const ConsoleEvent& event) {
  const auto& out = *o_.output;
  if (!out.forward && !o_.callbacks->on_console) return;
  if (!out.ranks.empty() && !out.ranks.count(p.rank)) return;
  console_->show(p.rank, stream, out.prefix ? std::string_view(p.prefix) : std::string_view(), event);
  if (console_->pending_bytes() >= kFlushAt) flush();
}

bool RankOutput::console_behind() const {
  for (ConsoleWriter* w : {o_.out->out(), o_.out->err()})
    if (w && w->behind()) return true;
  return false;
}

void RankOutput::hold_reading_if_behind() {
  if (reading_held_ || finished_ || !console_behind()) return;
  reading_held_ = true;
  for (auto& p : ranks_)
    for (Channel* c : {&p->out, &p->err})
      if (c->open) uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->pipe));
  uv_timer_start(&resume_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<RankOutput*>(t->data);
    self->host_.guarded("reading rank output again", [self] { self->resume_reading_if_room(); });
  }, kResumeCheckMs, kResumeCheckMs);
}

void RankOutput::resume_reading_if_room() {
  if (!reading_held_ || (console_behind() && !finished_)) return;
  reading_held_ = false;
  uv_timer_stop(&resume_timer_);
  const std::uint64_t now = uv_now(o_.loop);
  for (auto& p : ranks_) {
    p->out_stream->postpone(now), p->err_stream->postpone(now);
    for (Channel* c : {&p->out, &p->err})
      if (c->open) start_reading(*c);
  }
  arm_output_timer();
}

void RankOutput::flush() {
  const auto& to_caller = o_.callbacks->on_console;
  // stdout's writer is stderr's when both lead to one terminal or file (host_output.hpp).
  ConsoleWriter* out_writer = o_.out->out();
  ConsoleWriter* err_writer = o_.out->err();
  for (const auto& [stream, bytes] : console_->pending()) {
    if (err_writer) (stream == Stream::out ? out_writer : err_writer)->write(bytes);
    if (to_caller) user_callback("the on_console callback", on_console_broken_, [&] { to_caller(stream, bytes); });
  }
  console_->clear_pending();
}

void RankOutput::end_open_lines() {
  console_->end_open_lines();
  flush();
}

// Streams may hold the start of a line for a while (LiveSplitter): the timer wakes the loop
// when the first of them is due to be shown.
void RankOutput::arm_output_timer() {
  if (finished_) return;
  std::uint64_t due = LiveSplitter::kNever;
  for (auto& p : ranks_) due = std::min({due, p->out_stream->deadline(), p->err_stream->deadline()});
  if (due == LiveSplitter::kNever) {
    uv_timer_stop(&output_timer_);
    return;
  }
  const std::uint64_t now = uv_now(o_.loop);
  uv_timer_start(&output_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<RankOutput*>(t->data);
    self->host_.guarded("showing held rank output", [self] { self->on_output_timer(); });
  }, due > now ? due - now : 0, 0);
}

// A held line start whose quiet spell is over is shown, unless its end may still come:
//  - libuv runs timers before it polls, so after the loop itself was off the CPU the rest
//    may be in the pipe already: what is there is read first;
//  - a rank that is running (state R: computing, or runnable but cut off the CPU on a busy
//    machine) may be between two writes of one line; one waiting (at input(), in a sleep)
//    is not. The line of a running rank is held on, up to kInTransitMs.
void RankOutput::on_output_timer() {
  if (reading_held_) return;  // the rest of a held line may be in the pipe: see resume_reading_if_room
  const std::uint64_t now = uv_now(o_.loop);
  for (auto& p : ranks_) {
    for (int which : {1, 2}) {
      RankStream& stream = p->stream(which);
      if (stream.deadline() > now) continue;
      read_now(p->channel(which));
      if (stream.deadline() > now) continue;  // the line ended
      ProcStat st;
      const int pid = host_.live_pid(p->index);
      if (pid > 0 && read_proc_stat(pid, st) && st.state == 'R' && stream.extend(now)) continue;
      stream.tick(now);
    }
  }
  flush();
  arm_output_timer();
}

void RankOutput::note(int index, const std::string& text) {
  Pipes& p = *ranks_.at(static_cast<std::size_t>(index));
  p.err_stream->show_line("airhost: " + text);
  flush();
  o_.out->log("rank " + std::to_string(p.rank) + ": " + text);
}

void RankOutput::on_read(Channel& c, ssize_t nread, const uv_buf_t* buf) {
  Pipes& p = *c.pipes;
  if (nread > 0) {
    RankStream& stream = p.stream(c.which);
    stream.feed(std::string_view(buf->base, static_cast<std::size_t>(nread)), uv_now(o_.loop));
    if (const std::string failed = stream.take_log_failure(); !failed.empty()) {
      incomplete_logs_.push_back("rank " + std::to_string(p.rank) + ": " + failed);
      note(p.index, failed);
    }
    flush();
    arm_output_timer();
    hold_reading_if_behind();
    return;
  }
  if (nread < 0) close(c);  // UV_EOF or an error: either way this pipe is done
}

// What a rank's pipe holds now, read past libuv (the pipe is non-blocking) and fed as
// on_read does; EOF and errors are left for libuv's own read to see.
void RankOutput::read_now(Channel& c) {
  if (!c.open || reading_held_) return;
  uv_os_fd_t fd;
  if (uv_fileno(as_handle(&c.pipe), &fd) < 0) return;
  for (int reads = 0; reads < 16; ++reads) {
    const ssize_t n = ::read(fd, o_.buffer->data(), o_.buffer->size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const uv_buf_t buf = uv_buf_init(o_.buffer->data(), static_cast<unsigned>(n));
    on_read(c, n, &buf);
    if (reading_held_) return;
  }
}

void RankOutput::open(int index, int which, UniqueFd fd) {
  Channel& c = ranks_.at(static_cast<std::size_t>(index))->channel(which);
  if (int rc = uv_pipe_init(o_.loop, &c.pipe, 0); rc < 0)
    throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's output (uv_pipe_init)");
  c.pipe.data = &c;
  if (int rc = uv_pipe_open(&c.pipe, fd.get()); rc < 0) {
    uv_close(as_handle(&c.pipe), nullptr);  // fd is still ours: UniqueFd closes it
    throw std::system_error(-rc, std::generic_category(), "cannot watch a rank's output (uv_pipe_open)");
  }
  fd.release();
  c.open = true;
  if (reading_held_) return;  // started with the others when the console has room again
  if (const int rc = start_reading(c); rc < 0) {
    close(c);
    throw std::system_error(-rc, std::generic_category(), "cannot read a rank's output (uv_read_start)");
  }
}

int RankOutput::start_reading(Channel& c) {
  return uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c.pipe),
      [](uv_handle_t* h, size_t, uv_buf_t* buf) {
        auto* self = static_cast<Channel*>(h->data)->pipes->owner;
        *buf = uv_buf_init(self->o_.buffer->data(), static_cast<unsigned>(self->o_.buffer->size()));
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
        auto* ch = static_cast<Channel*>(s->data);
        RankOutput* self = ch->pipes->owner;
        self->host_.guarded("reading a rank's output", [&] { self->on_read(*ch, n, buf); });
      });
}

void RankOutput::close(int index, int which) { close(ranks_.at(static_cast<std::size_t>(index))->channel(which)); }

void RankOutput::close(Channel& c) {
  if (!c.open) return;
  c.open = false;
  Pipes& p = *c.pipes;
  RankStream& stream = p.stream(c.which);
  stream.finish();
  if (!stream.trimmed().empty()) trimmed_logs_.push_back("rank " + std::to_string(p.rank) + ": " + stream.trimmed());
  flush();
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c.pipe));
  uv_close(as_handle(&c.pipe), [](uv_handle_t* h) {
    auto* ch = static_cast<Channel*>(h->data);
    ch->pipes->owner->host_.closed(ch->pipes->index);
  });
}

bool RankOutput::any_open(int index) const {
  const Pipes& p = *ranks_.at(static_cast<std::size_t>(index));
  return p.out.open || p.err.open;
}

void RankOutput::finish() {
  if (finished_) return;
  finished_ = true;
  uv_close(as_handle(&output_timer_), nullptr);
  uv_close(as_handle(&resume_timer_), nullptr);
}

}  // namespace airhost::detail
