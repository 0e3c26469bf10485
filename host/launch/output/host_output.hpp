// host_output.hpp — what airhost itself writes during a run, and where it goes.
//
// Two places, for the whole run (every attempt of a restarted run, and the node link's join):
//   - the host's stdout and stderr, through ConsoleWriters (console_writer.hpp), so that no
//     line of the host's, a rank's output or its own, ever blocks on a reader that stalled;
//   - the run's host log, <run_dir>/logs/host.log: every line airhost says about the run (a
//     note on a rank, a restart, a node joining, a host failure), with its time, whether or
//     not the terminal got it. The ranks' logs hold the ranks' bytes and nothing else, so a
//     note is never glued to a rank's unfinished line (a progress bar) there.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "base/unique_fd.hpp"
#include "launch/output/console_writer.hpp"

namespace airhost::detail {

class HostOutput {
 public:
  // `forward`: the host writes to its stdout and stderr (LaunchSpec::output.forward); when
  // false only the host log is written. The host log opens in `run_dir`/logs, which exists.
  HostOutput(bool forward, const std::string& run_dir);
  ~HostOutput();
  HostOutput(const HostOutput&) = delete;
  HostOutput& operator=(const HostOutput&) = delete;

  // The writers of the host's stdout and stderr; null when not forwarding. When one terminal
  // (or file) is behind both they are one writer, so its order is the loop's and no line of
  // one stream is cut by the other's.
  ConsoleWriter* out() const noexcept { return out_ ? out_.get() : err_.get(); }
  ConsoleWriter* err() const noexcept { return err_.get(); }

  // A line of airhost's own (no "airhost: " and no '\n' in `line`): into the host log with its
  // time, on stderr as "airhost: LINE" when forwarding, and to the listener (a caller that
  // shows the console itself: Callbacks::on_host_line). Any thread; never blocks on a reader.
  void say(std::string_view line);
  // Set before the first line is said (not thread-safe against say()).
  void set_listener(std::function<void(const std::string&)> listener) { listener_ = std::move(listener); }
  // Into the host log only: what the console already showed in its own way (a rank's note).
  void log(std::string_view line);

  // What the reader has not taken yet gets up to `timeout` (see ConsoleWriter::drain).
  void drain(std::chrono::milliseconds timeout);
  // Stops the writers; returns every byte of output the reader never got, in all.
  std::uint64_t close();

  const std::string& log_path() const noexcept { return log_path_; }

 private:
  std::unique_ptr<ConsoleWriter> out_, err_;
  std::function<void(const std::string&)> listener_;
  std::string log_path_;
  UniqueFd log_fd_;
  bool log_broken_ = false;  // a write failed (a full disk): said once, then tried no more
  std::mutex log_mutex_;
  std::uint64_t unshown_ = 0;
  bool closed_ = false;
};

}  // namespace airhost::detail
