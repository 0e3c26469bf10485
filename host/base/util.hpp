// util.hpp — small system helpers shared by the host's files.
#pragma once

#include <spawn.h>

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace airhost::detail {

double now_seconds();                     // wall clock, seconds since the epoch
std::string signal_name(int sig);         // 11 → "SIGSEGV"
// Writes everything, retrying on EINTR and waiting out EAGAIN on a non-blocking fd.
// Returns false when the fd is gone (EPIPE and friends): output is then dropped, never fatal.
bool write_all(int fd, std::string_view data);
// Whether two descriptors lead to one file (one terminal, say): false when either is closed.
bool same_file(int fd_a, int fd_b);
// The size of the terminal behind `fd` ({columns, lines}); {0, 0} when it is not a terminal.
std::pair<int, int> terminal_size(int fd);
std::vector<std::string> current_environment();
std::string getenv_or(const char* name, const std::string& fallback);
std::string current_directory();
std::string executable_path();            // /proc/self/exe
std::string dirname_of(const std::string& path);
bool is_executable(const std::string& path);
// A regular file (following links) at `path`.
bool is_file(const std::string& path);
std::string json_escape(std::string_view s);  // contents of a JSON string, without quotes
std::string json_quoted(std::string_view s);  // a JSON string: "…", escaped
// 'text' as the user wrote it, for a message (no escaping: shell_quote is for the shell).
std::string single_quoted(std::string_view text);
// The pieces of `s` between each `sep`, empty ones kept: "a,,b" → {"a", "", "b"}; "" → {""}.
std::vector<std::string> split(std::string_view s, char sep);
std::string duration_text(std::chrono::milliseconds ms);  // "3 s", "1.5 s": a configured duration
std::string bytes_text(double bytes);
// Seconds since the epoch as local time, strftime's `format` ("%Y-%m-%d %H:%M:%S").
std::string local_time_text(double t, const char* format);         // "8 B", "16 MiB", "1.5 GiB"
// 'text' for /bin/sh, single quotes inside escaped: safe for any path or program text.
std::string shell_quote(const std::string& text);
// Runs `command` with /bin/sh and collects its stdout into `out`; returns its wait status
// (0 = exited 0), or -1 when it could not be started.
int run_capture(const std::string& command, std::string& out);

// posix_spawn attributes of a helper the host starts and ends itself (the CLI's MLflow helper,
// the flight recorder's summary): a process group of its own, so that the terminal's Ctrl-C and
// Ctrl-\ (sent to the foreground group) reach the host and not the helper, and an empty signal
// mask, whatever the calling thread blocks.
class HelperSpawnAttr {
 public:
  HelperSpawnAttr();
  ~HelperSpawnAttr() { posix_spawnattr_destroy(&attr_); }
  HelperSpawnAttr(const HelperSpawnAttr&) = delete;
  HelperSpawnAttr& operator=(const HelperSpawnAttr&) = delete;
  const posix_spawnattr_t* get() const noexcept { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

// Ranks (or node ranks) as compact ranges: {0, 2, 3, 4, 7} → "0,2-4,7".
std::string rank_ranges(std::vector<int> ranks);

}  // namespace airhost::detail
