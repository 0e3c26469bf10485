#include "launch/log_stream.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "base/util.hpp"

namespace airhost::detail {

void LineSplitter::feed(std::string_view bytes, const Emit& emit) {
  // Emits the first max_line bytes of (partial_ + text) as an incomplete piece while the
  // pending line is longer than max_line.
  auto spill = [&](std::string_view& text) {
    while (partial_.size() + text.size() > max_line_) {
      const std::size_t take = max_line_ - partial_.size();
      if (partial_.empty()) {
        emit(text.substr(0, take), false);
      } else {
        partial_.append(text.substr(0, take));
        emit(partial_, false);
        partial_.clear();
      }
      text.remove_prefix(take);
    }
  };
  while (!bytes.empty()) {
    const auto nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      spill(bytes);
      partial_.append(bytes);
      return;
    }
    std::string_view line = bytes.substr(0, nl);
    bytes.remove_prefix(nl + 1);
    spill(line);
    if (partial_.empty()) {
      emit(line, true);  // the common case: no copy at all
    } else {
      partial_.append(line);
      emit(partial_, true);
      partial_.clear();
    }
  }
}

void LineSplitter::finish(const Emit& emit) {
  if (!partial_.empty()) {
    emit(partial_, true);
    partial_.clear();
  }
}

void LiveSplitter::add_text(std::string_view text, std::uint64_t now_ms, const Emit& emit) {
  if (text.empty()) return;
  if (shown_) {
    emit({ConsoleEvent::Kind::text, text});
    return;
  }
  if (held_.empty()) held_since_ = now_ms;
  held_.append(text);
  if (held_.size() >= max_held_) show_held(emit);
}

void LiveSplitter::show_held(const Emit& emit) {
  if (!held_.empty()) emit({ConsoleEvent::Kind::text, held_});
  held_.clear();
  shown_ = true;
}

void LiveSplitter::feed(std::string_view bytes, std::uint64_t now_ms, const Emit& emit) {
  if (bytes.empty()) return;
  if (cr_pending_) {
    cr_pending_ = false;
    if (bytes.front() == '\n') {
      add_text("\r", now_ms, emit);  // "\r\n": the '\r' is part of the line, as the log has it
    } else {
      show_held(emit);
      emit({ConsoleEvent::Kind::redraw, {}});
    }
  }
  // The next '\n' and '\r' are each found by memchr and remembered until passed, so every
  // byte is scanned once for each (find_first_of would call memchr per byte: 3x the host's
  // CPU on a flood of output).
  constexpr auto npos = std::string_view::npos;
  std::size_t pos = 0, nl = bytes.find('\n'), cr = bytes.find('\r');
  while (pos < bytes.size()) {
    if (nl != npos && nl < pos) nl = bytes.find('\n', pos);
    if (cr != npos && cr < pos) cr = bytes.find('\r', pos);
    const std::size_t at = std::min(nl, cr);
    const std::string_view text = bytes.substr(pos, at == npos ? npos : at - pos);
    if (at == nl && at != npos && held_.empty()) {
      if (!text.empty()) emit({ConsoleEvent::Kind::text, text});  // the common case: a whole line, no copy
    } else {
      add_text(text, now_ms, emit);
    }
    if (at == npos) return;
    pos = at + 1;
    if (at == nl) {
      if (!held_.empty()) emit({ConsoleEvent::Kind::text, held_});
      held_.clear();
      shown_ = false;
      emit({ConsoleEvent::Kind::end, {}});
    } else if (pos == bytes.size()) {
      cr_pending_ = true;
    } else if (bytes[pos] == '\n') {
      add_text("\r", now_ms, emit);
    } else {
      // What came before the '\r' goes out too (the terminal shows it until the redraw).
      show_held(emit);
      emit({ConsoleEvent::Kind::redraw, {}});
    }
  }
}

void LiveSplitter::tick(std::uint64_t now_ms, const Emit& emit) {
  if (now_ms >= deadline()) show_held(emit);
}

void LiveSplitter::break_line(const Emit& emit) {
  if (held_.empty() && !shown_) return;
  show_held(emit);
  shown_ = false;
  emit({ConsoleEvent::Kind::end, {}});
}

void LiveSplitter::finish(const Emit& emit) {
  if (cr_pending_) {
    cr_pending_ = false;
    add_text("\r", 0, emit);
  }
  break_line(emit);
}

void Console::write(Stream stream, std::string_view bytes) {
  if (used_ == 0 || pending_[used_ - 1].first != stream) {
    if (used_ == pending_.size()) pending_.emplace_back();
    pending_[used_++].first = stream;
  }
  pending_[used_ - 1].second.append(bytes);
  pending_bytes_ += bytes.size();
}

void Console::show(int rank, Stream stream, std::string_view prefix, const ConsoleEvent& event) {
  OpenLine& line = screen_of(stream);
  const bool mine = line.open && line.rank == rank && line.stream == stream;
  if (line.open && !mine) write(line.stream, "\n");  // another's line: end it before ours starts
  switch (event.kind) {
    case ConsoleEvent::Kind::text:
      if (!mine) write(stream, prefix);
      write(stream, event.text);
      line = {true, rank, stream};
      break;
    case ConsoleEvent::Kind::redraw:
      // On a line of its own the bar starts where its prefix ends; on a line just started,
      // the prefix alone does it.
      if (mine) write(stream, "\r");
      write(stream, prefix);
      line = {true, rank, stream};
      break;
    case ConsoleEvent::Kind::end:
      if (!mine) write(stream, prefix);
      write(stream, "\n");
      line.open = false;
      break;
  }
}

void Console::end_open_lines() {
  for (OpenLine& line : screens_) {
    if (line.open) write(line.stream, "\n");
    line.open = false;
  }
}

RankStream::RankStream(std::string log_path, std::size_t max_line, std::uint64_t quiet_ms, OnLine on_line, OnShow on_show)
    : log_path_(std::move(log_path)),
      lines_(max_line),
      live_(max_line, quiet_ms),
      on_line_(std::move(on_line)),
      on_show_(std::move(on_show)) {
  log_fd_ = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd_ < 0) throw std::system_error(errno, std::generic_category(), "cannot open log " + log_path_);
}

RankStream::~RankStream() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void RankStream::feed(std::string_view bytes, std::uint64_t now_ms) {
  if (log_failure_.empty()) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(log_fd_, bytes.data() + done, bytes.size() - done);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        const int err = n < 0 ? errno : ENOSPC;
        log_failure_ = "its log " + log_path_ + " stops at byte " + std::to_string(logged_ + done) + ": " +
                       std::strerror(err) + "; the console still gets every line";
        break;
      }
    }
    logged_ += done;
  }
  if (on_line_) lines_.feed(bytes, [this](std::string_view line, bool) { on_line_(line); });
  live_.feed(bytes, now_ms, on_show_);
}

std::string RankStream::take_log_failure() {
  if (log_failure_.empty() || log_failure_taken_) return {};
  log_failure_taken_ = true;
  return log_failure_;
}

void RankStream::show_line(std::string_view line) {
  live_.break_line(on_show_);
  on_show_({ConsoleEvent::Kind::text, line});
  on_show_({ConsoleEvent::Kind::end, {}});
}

void RankStream::finish() {
  if (on_line_) lines_.finish([this](std::string_view line, bool) { on_line_(line); });
  live_.finish(on_show_);
}

std::string rank_prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

}  // namespace airhost::detail
