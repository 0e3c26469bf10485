// host_output.cpp — the host's writers and its log (host_output.hpp).
#include "launch/output/host_output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "base/util.hpp"

namespace airhost::detail {
namespace {

// "2026-12-05 03:41:07.123" (UTC): when a line was said, to set beside the ranks' output.
std::string utc_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  std::tm tm{};
  ::gmtime_r(&ts.tv_sec, &tm);
  char buf[48];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03ld", ts.tv_nsec / 1000000);
  return buf;
}

}  // namespace

HostOutput::HostOutput(bool forward, const std::string& run_dir) : log_path_(run_dir + "/logs/host.log") {
  if (forward) {
    const std::string where = "the logs in " + run_dir + "/logs";
    err_ = std::make_unique<ConsoleWriter>(STDERR_FILENO, ConsoleWriter::kDefaultCap, where);
    if (!same_file(STDOUT_FILENO, STDERR_FILENO))
      out_ = std::make_unique<ConsoleWriter>(STDOUT_FILENO, ConsoleWriter::kDefaultCap, where);
  }
  // Opened when the first line comes: a run with nothing to say leaves no empty file.
}

HostOutput::~HostOutput() { close(); }

void HostOutput::log(std::string_view line) {
  std::lock_guard lock(log_mutex_);
  if (log_broken_) return;
  if (!log_fd_) {
    log_fd_.reset(::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!log_fd_) {
      log_broken_ = true;
      if (err_) err_->write("airhost: cannot write " + log_path_ + ": " + std::strerror(errno) + "\n");
      return;
    }
  }
  std::string entry = utc_now() + " " + std::string(line) + "\n";
  if (!write_all(log_fd_.get(), entry)) {
    log_broken_ = true;
    if (err_) err_->write("airhost: cannot write " + log_path_ + " (" + std::strerror(errno) + "); the host log stops here\n");
  }
}

void HostOutput::say(std::string_view line) {
  log(line);
  if (err_) err_->write("airhost: " + std::string(line) + "\n");
  if (listener_) {
    try {
      listener_(std::string(line));
    } catch (...) {
      // the caller's callback: its failure is not the run's
    }
  }
}

void HostOutput::drain(std::chrono::milliseconds timeout) {
  for (ConsoleWriter* w : {out_.get(), err_.get()})
    if (w) w->drain(timeout);
}

std::uint64_t HostOutput::close() {
  if (!closed_) {
    closed_ = true;
    for (ConsoleWriter* w : {out_.get(), err_.get()})
      if (w) unshown_ += w->close();
  }
  return unshown_;
}

}  // namespace airhost::detail
