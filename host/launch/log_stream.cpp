#include "launch/log_stream.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

RankStream::RankStream(std::string log_path, std::size_t max_line, OnLine on_line)
    : log_path_(std::move(log_path)), splitter_(max_line), on_line_(std::move(on_line)) {
  log_fd_ = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd_ < 0) throw std::system_error(errno, std::generic_category(), "cannot open log " + log_path_);
}

RankStream::~RankStream() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void RankStream::feed(std::string_view bytes) {
  write_all(log_fd_, bytes);
  splitter_.feed(bytes, [this](std::string_view line, bool) { on_line_(line); });
}

void RankStream::finish() {
  splitter_.finish([this](std::string_view line, bool) { on_line_(line); });
}

std::string rank_prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

}  // namespace airhost::detail
