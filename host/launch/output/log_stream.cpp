#include "launch/output/log_stream.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "launch/run/run_dir.hpp"

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
  if (held_.empty()) held_since_ = held_first_ = now_ms;
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

void Console::cut(OpenLine& line) {
  write(line.stream, "\n");
  cut_.emplace_back(line.rank, line.stream);
  line.open = false;
}

bool Console::take_cut(int rank, Stream stream) {
  const auto at = std::find(cut_.begin(), cut_.end(), std::pair{rank, stream});
  if (at == cut_.end()) return false;
  cut_.erase(at);
  return true;
}

void Console::show(int rank, Stream stream, std::string_view prefix, const ConsoleEvent& event) {
  OpenLine& line = screen_of(stream);
  const bool mine = line.open && line.rank == rank && line.stream == stream;
  if (line.open && !mine) cut(line);  // another's line: end it before ours starts
  // This line was cut and nothing more of it came: its end is already on the console.
  if (take_cut(rank, stream) && event.kind == ConsoleEvent::Kind::end) return;
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
  for (OpenLine& line : screens_)
    if (line.open) cut(line);
}

RankStream::RankStream(std::string log_path, std::size_t max_line, std::uint64_t quiet_ms, OnLine on_line, OnShow on_show,
                       std::uint64_t log_max_bytes)
    : log_path_(std::move(log_path)),
      max_bytes_(log_max_bytes),
      lines_(max_line),
      live_(max_line, quiet_ms),
      on_line_(std::move(on_line)),
      on_show_(std::move(on_show)) {
  log_fd_ = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd_ < 0) throw std::system_error(errno, std::generic_category(), "cannot open log " + log_path_);
  struct stat st{};
  if (::fstat(log_fd_, &st) == 0) logged_ = static_cast<std::uint64_t>(st.st_size);  // a restart's log goes on
}

RankStream::~RankStream() {
  if (log_fd_ >= 0) ::close(log_fd_);
  if (tail_fd_ >= 0) ::close(tail_fd_);
}

void RankStream::feed(std::string_view bytes, std::uint64_t now_ms) {
  if (max_bytes_ > 0 && log_failure_.empty()) {
    const std::uint64_t head = max_bytes_ / 2;
    const std::size_t fits = logged_ >= head ? 0 : static_cast<std::size_t>(std::min<std::uint64_t>(head - logged_, bytes.size()));
    if (fits) write_log(bytes.substr(0, fits));
    if (fits < bytes.size()) write_tail(bytes.substr(fits));
  } else {
    write_log(bytes);
  }
  if (on_line_) lines_.feed(bytes, [this](std::string_view line, bool) { on_line_(line); });
  live_.feed(bytes, now_ms, on_show_);
}

void RankStream::write_tail(std::string_view bytes) {
  const std::uint64_t chunk = std::max<std::uint64_t>(1, max_bytes_ / 4);
  while (!bytes.empty() && log_failure_.empty()) {
    if (tail_fd_ < 0 || tail_bytes_ >= chunk) {
      if (tail_fd_ >= 0) {
        ::close(tail_fd_);
        tail_index_ ^= 1;
      }
      // The older tail goes: its bytes are the ones cut.
      struct stat st{};
      if (tail_used_[tail_index_] && ::stat(tail_path(tail_index_).c_str(), &st) == 0)
        cut_bytes_ += static_cast<std::uint64_t>(st.st_size);
      tail_fd_ = ::open(tail_path(tail_index_).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      tail_used_[tail_index_] = true;
      tail_bytes_ = 0;
      if (tail_fd_ < 0) {
        log_failure_ = "its log tail " + tail_path(tail_index_) + " cannot be written: " + std::strerror(errno);
        return;
      }
    }
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk - tail_bytes_, bytes.size()));
    if (!write_all(tail_fd_, bytes.substr(0, n))) {
      log_failure_ = "its log tail " + tail_path(tail_index_) + " stops: " + std::strerror(errno);
      return;
    }
    tail_bytes_ += n;
    bytes.remove_prefix(n);
  }
}

void RankStream::write_log(std::string_view bytes) {
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
  if (tail_fd_ >= 0) {
    // The bounded log: its head, a line saying what was cut, then what the tails kept.
    ::close(tail_fd_);
    tail_fd_ = -1;
    const int older = tail_index_ ^ 1;
    if (cut_bytes_ > 0) {
      trimmed_ = "its log " + log_path_ + " keeps its first " + std::to_string(max_bytes_ / 2) + " bytes and its last; " +
                 std::to_string(cut_bytes_) + " bytes between were cut (log_max_size)";
      write_log((ends_line(log_path_) ? "" : "\n") + std::string("----- airhost: ") + std::to_string(cut_bytes_) +
                " bytes cut here (log_max_size keeps the first and the last of each log) -----\n");
    }
    for (int i : {older, tail_index_}) {
      if (!tail_used_[i]) continue;
      UniqueFd in(::open(tail_path(i).c_str(), O_RDONLY | O_CLOEXEC));
      char buf[1 << 16];
      ssize_t n;
      while (in && (n = ::read(in.get(), buf, sizeof buf)) > 0) write_log(std::string_view(buf, static_cast<std::size_t>(n)));
      ::unlink(tail_path(i).c_str());
    }
  }
  if (on_line_) lines_.finish([this](std::string_view line, bool) { on_line_(line); });
  live_.finish(on_show_);
}


}  // namespace airhost::detail
