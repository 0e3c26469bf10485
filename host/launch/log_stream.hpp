// log_stream.hpp — rank output: raw log files, line splitting, prefixed forwarding.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <string_view>

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

// One output stream of one rank: appends every byte to its log file as it arrives (the log
// is complete even if the host dies next), and hands whole lines to `on_line`.
class RankStream {
 public:
  using OnLine = std::function<void(std::string_view line)>;
  RankStream(std::string log_path, std::size_t max_line, OnLine on_line);
  ~RankStream();
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  void feed(std::string_view bytes);
  void finish();
  const std::string& log_path() const noexcept { return log_path_; }

 private:
  std::string log_path_;
  int log_fd_ = -1;
  LineSplitter splitter_;
  OnLine on_line_;
};

// "[rank 3] " — the prefix of forwarded lines.
std::string rank_prefix(int rank);

}  // namespace airhost::detail
