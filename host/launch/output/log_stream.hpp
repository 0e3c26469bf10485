// log_stream.hpp — rank output: raw log files, line splitting, and what the console shows.
//
// A rank's bytes take two roads. The log file gets every byte as it arrives. The console
// (the caller's terminal, a pipe, a notebook cell) gets them cut by LiveSplitter into
// events — text of the current line, a `\r` redraw, the end of a line — as soon as they are
// worth showing, and Console turns the events of every rank into the bytes to write, with
// the rank prefixes, never letting two ranks share a line. Both are pure: time comes in as
// an argument, output goes out through callbacks or a buffer, so the tests drive them
// without processes or clocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "airhost/callbacks.hpp"

namespace airhost::detail {

// Splits a byte stream into lines. Bytes are never altered or dropped: invalid UTF-8 and
// NULs pass through. A line longer than max_line is emitted in max_line pieces (complete
// = false for all but the last), so one rank cannot make the host buffer without bound.
class LineSplitter {
 public:
  using Emit = std::function<void(std::string_view line, bool complete)>;
  explicit LineSplitter(std::size_t max_line = 16u << 20) : max_line_(max_line ? max_line : 1) {}
  void feed(std::string_view bytes, const Emit& emit);
  // At EOF: emits the last line if it had no newline.
  void finish(const Emit& emit);
  std::size_t buffered() const noexcept { return partial_.size(); }

 private:
  std::size_t max_line_;
  std::string partial_;
};

// One step of what the console shows of one rank stream.
struct ConsoleEvent {
  enum class Kind {
    text,    // more bytes of the current line (never a '\n'; a '\r' only as the first half of "\r\n")
    redraw,  // a '\r' that is not part of "\r\n": the line is drawn again from its start (a progress bar)
    end,     // the line ended ('\n')
  };
  Kind kind;
  std::string_view text;  // Kind::text only
};

// Cuts one rank stream into ConsoleEvents as it arrives, so that a progress bar moves and
// a prompt shows, while ordinary lines still go out whole:
//   - a complete line goes out at its '\n', in one piece;
//   - a '\r' redraw goes out at once, and so does the rest of its line as it comes: a bar
//     redrawn every 0.1 s is seen every 0.1 s;
//   - the start of a line with neither (print(..., end=""), a prompt, dots) is held, in case
//     its end follows, for `quiet_ms` after its first held byte, then shown; once part of a
//     line is shown, what follows of it is shown at once;
//   - but a start of kInTransitBytes or more is a long line in transit, not a prompt: its
//     writer is blocked on the full pipe, or cut off the CPU between two writes, and may take
//     longer than quiet_ms to send the rest on a busy machine; it is held kInTransitMs;
//   - a line longer than max_held is shown without waiting, so that one rank cannot make the
//     host buffer without bound.
// Holding is what keeps lines whole: the bytes of a line usually arrive within micro-
// seconds (one write, or a pipe read cutting it), and a line shown in parts may be cut by
// another rank's line on the console (see Console). A '\r' at the end of what arrived is
// held until the next byte tells a redraw from a "\r\n" line end.
class LiveSplitter {
 public:
  using Emit = std::function<void(const ConsoleEvent&)>;
  static constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  static constexpr std::size_t kInTransitBytes = 4096;
  static constexpr std::uint64_t kInTransitMs = 2000;

  LiveSplitter(std::size_t max_held, std::uint64_t quiet_ms) : max_held_(max_held ? max_held : 1), quiet_ms_(quiet_ms) {}
  void feed(std::string_view bytes, std::uint64_t now_ms, const Emit& emit);
  // Shows a held line start whose quiet spell is over.
  void tick(std::uint64_t now_ms, const Emit& emit);
  // When tick() will have something to show; kNever when nothing is held.
  std::uint64_t deadline() const noexcept {
    if (held_.empty()) return kNever;
    return held_since_ + (held_.size() >= kInTransitBytes ? std::max(quiet_ms_, kInTransitMs) : quiet_ms_);
  }
  // The host did not read the rank for a while (the console was behind): the rest of a held
  // line may be waiting in the pipe, so its quiet spell starts again now.
  void postpone(std::uint64_t now_ms) noexcept {
    if (!held_.empty()) held_since_ = held_first_ = now_ms;
  }
  // The quiet spell is over but the writer is still running (on a busy machine, cut off the
  // CPU between two writes of one line): holds the line one more quiet spell, up to
  // kInTransitMs in all. False when nothing is held or it has been held that long.
  bool extend(std::uint64_t now_ms) noexcept {
    if (held_.empty() || now_ms - held_first_ >= std::max(quiet_ms_, kInTransitMs)) return false;
    held_since_ = now_ms;
    return true;
  }
  // Shows what is held and ends the line: something else (a host note) needs a line of its own.
  void break_line(const Emit& emit);
  // At EOF: shows what is held and ends an unfinished line.
  void finish(const Emit& emit);

 private:
  void add_text(std::string_view text, std::uint64_t now_ms, const Emit& emit);
  void show_held(const Emit& emit);

  std::size_t max_held_;
  std::uint64_t quiet_ms_;
  std::string held_;              // the current line's bytes not shown yet
  std::uint64_t held_since_ = 0;  // when held_ got its first byte (or was last extended)
  std::uint64_t held_first_ = 0;  // when held_ got its first byte
  bool shown_ = false;            // part of the current line is on the console: show the rest at once
  bool cr_pending_ = false;       // the last byte was a '\r'; the next one says which kind
};

// The console all ranks share: turns each rank stream's events into the bytes to write to
// stdout and stderr, in order. A rank's line starts with its prefix; a redraw writes '\r'
// and the prefix again, so the bar moves under its rank's name. One line at a time is open
// per screen: when a rank's line is open (a partial line, a bar) and another rank (or the
// same rank's other stream) has something to show there, the open line is ended with a '\n'
// first and its continuation later starts with its prefix again. So a line on the console
// always belongs to one rank; what a user sees of the interrupted line is its two parts, each
// named, on two lines — better than one line holding two ranks' text, and better than
// holding the other ranks back while one waits at a prompt. (Two ranks drawing bars at once
// then alternate lines rather than redraw in place: show one with --ranks.) The logs keep
// the bytes as written; only the console gets these line breaks.
class Console {
 public:
  // shared_screen: stdout and stderr end up on one screen (one terminal, one file), so a line
  // open on either is ended before the other writes; otherwise each keeps its own open line.
  explicit Console(bool shared_screen) : shared_screen_(shared_screen) {}
  void show(int rank, Stream stream, std::string_view prefix, const ConsoleEvent& event);
  // Ends the lines left open (a prompt, a bar), so that what the host writes next past the
  // console (a note of its own) starts a line; their rest is named again.
  void end_open_lines();
  // The bytes to write, in order, each run on one stream; consecutive writes to one stream
  // are merged.
  std::span<const std::pair<Stream, std::string>> pending() const noexcept { return {pending_.data(), used_}; }
  std::size_t pending_bytes() const noexcept { return pending_bytes_; }
  // Empties the runs but keeps their buffers: a flood of output then costs one copy per byte,
  // not a reallocation per flush.
  void clear_pending() {
    for (std::size_t i = 0; i < used_; ++i) pending_[i].second.clear();
    used_ = 0, pending_bytes_ = 0;
  }

 private:
  struct OpenLine {
    bool open = false;
    int rank = 0;
    Stream stream = Stream::out;
  };
  OpenLine& screen_of(Stream stream) { return screens_[shared_screen_ || stream == Stream::out ? 0 : 1]; }
  void write(Stream stream, std::string_view bytes);
  // Ends an open line on the console for something else; its rank's line goes on later.
  void cut(OpenLine& line);
  // Whether the current line of `rank`'s `stream` was cut so (forgotten once asked).
  bool take_cut(int rank, Stream stream);

  bool shared_screen_;
  OpenLine screens_[2];
  // The rank streams whose line was ended on the console while it went on in the rank: if
  // that line then ends with nothing more, the console has ended it already (no empty line).
  std::vector<std::pair<int, Stream>> cut_;
  std::vector<std::pair<Stream, std::string>> pending_;  // the first used_ are in use
  std::size_t used_ = 0;
  std::size_t pending_bytes_ = 0;
};

// One output stream of one rank: appends every byte to its log file as it arrives (the log
// is complete even if the host dies next), hands whole lines to `on_line` (when given: the
// embedding API's line callback) and console events to `on_show`.
class RankStream {
 public:
  using OnLine = std::function<void(std::string_view line)>;
  using OnShow = LiveSplitter::Emit;
  // `log_max_bytes` > 0 bounds the log: its first half is written as it comes, the rest goes to
  // two tail files of a quarter each, the older dropped as a new one starts, and finish()
  // appends what is left of the tail after a line saying how much was cut.
  RankStream(std::string log_path, std::size_t max_line, std::uint64_t quiet_ms, OnLine on_line, OnShow on_show,
             std::uint64_t log_max_bytes = 0);
  ~RankStream();
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  void feed(std::string_view bytes, std::uint64_t now_ms);
  void tick(std::uint64_t now_ms) { live_.tick(now_ms, on_show_); }
  void postpone(std::uint64_t now_ms) noexcept { live_.postpone(now_ms); }
  bool extend(std::uint64_t now_ms) noexcept { return live_.extend(now_ms); }
  std::uint64_t deadline() const noexcept { return live_.deadline(); }
  // airhost's own line about the rank (no '\n'): on the console as a line of its own, under
  // the rank's name. Not in the log, nor to on_line: those are the rank's bytes alone.
  void show_line(std::string_view line);
  void finish();
  const std::string& log_path() const noexcept { return log_path_; }
  // Once, after the log could not be written (a full disk, a quota, an I/O error): one
  // sentence naming the file, the byte where it stops and why; empty otherwise. The log takes
  // nothing more; the console still gets every byte.
  std::string take_log_failure();
  // After finish(), with log_max_bytes: what was cut from the middle, one sentence; else empty.
  const std::string& trimmed() const noexcept { return trimmed_; }

 private:
  std::string log_path_;
  int log_fd_ = -1;
  std::uint64_t logged_ = 0;        // bytes of this stream in the log so far
  std::string log_failure_;         // why the log stopped, when it did
  bool log_failure_taken_ = false;
  // log_max_bytes: the tail files (path.tail0/.tail1), the one being written, its size, and the
  // bytes dropped with older tails.
  std::uint64_t max_bytes_ = 0;
  int tail_fd_ = -1;
  int tail_index_ = 0;
  bool tail_used_[2] = {false, false};
  std::uint64_t tail_bytes_ = 0;
  std::uint64_t cut_bytes_ = 0;
  std::string trimmed_;
  void write_log(std::string_view bytes);
  void write_tail(std::string_view bytes);
  std::string tail_path(int index) const { return log_path_ + ".tail" + std::to_string(index); }
  LineSplitter lines_;
  LiveSplitter live_;
  OnLine on_line_;
  OnShow on_show_;
};


}  // namespace airhost::detail
