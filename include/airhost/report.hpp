// airhost/report.hpp — what a finished run hands back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace airhost {

// A rank's return value handed over by descriptor instead of through the control channel.
//
// A result of more than 64 KiB never travels through a pipe: the rank pickles it (protocol 5,
// the storage of tensors and arrays kept out of band, so it is written once) straight into
// shared memory (a memfd, sealed against writing, growing and shrinking once written) or,
// when shared memory lacks room, an unnamed file (O_TMPFILE) in the run directory's
// results/, and passes the descriptor over the control channel (SCM_RIGHTS). Nothing names
// it: it is gone when the last descriptor and the last mapping of it are.
//
// Layout (every integer a little-endian u64):
//   offset 0   "AHRESULT", version (1), total size, stream offset, stream length,
//              table offset, buffer count, reserved (0)                      = 64 bytes
//   stream     a pickle (protocol 5) whose out-of-band buffers are, in order, the
//              entries of the table; or the JSON text of a result_format = "json" entry
//   buffers    each at a 64-byte aligned offset
//   table      buffer count × (offset, length)
//
// A reader that can map memory (the Python API) unpickles the stream with buffers that point
// into the mapping, so tensors and arrays are not copied at all. ResultBlob gives C++ callers
// the same value as plain bytes.
class ResultBlob {
 public:
  // Takes ownership of `fd` and checks that it holds a whole result of `expected_size` bytes:
  // a regular file, sealed against writes and size changes when it is shared memory, unnamed
  // (no link left) when it is a file. Throws std::runtime_error saying what is wrong (the
  // descriptor is closed then).
  static std::shared_ptr<const ResultBlob> adopt(int fd, std::uint64_t expected_size);

  ~ResultBlob();
  ResultBlob(const ResultBlob&) = delete;
  ResultBlob& operator=(const ResultBlob&) = delete;

  int fd() const noexcept { return fd_; }  // borrowed; read it with pread or mmap(MAP_PRIVATE)
  std::uint64_t size() const noexcept { return size_; }
  bool in_shared_memory() const noexcept { return shared_memory_; }
  std::size_t buffer_count() const noexcept { return buffers_.size(); }

  // The value as RankReport::result holds an inline one: the JSON text, or a pickle that
  // plain `pickle.loads` takes (the out-of-band buffers put back in band). A copy: for
  // hundreds of MB, prefer write_to() or mapping fd() yourself.
  std::string to_string() const;
  // The same bytes, streamed to `out_fd`. Throws std::system_error (a full disk, say).
  void write_to(int out_fd) const;

 private:
  struct Span {
    std::uint64_t offset, length;
  };
  ResultBlob() = default;
  template <typename Sink>
  void emit(Sink&& sink) const;

  int fd_ = -1;
  std::uint64_t size_ = 0;
  bool shared_memory_ = false;
  Span stream_{0, 0};
  std::vector<Span> buffers_;
};

// An exception captured inside a rank's interpreter and sent over the control channel.
struct ErrorRecord {
  std::string type;        // qualified name, e.g. "ValueError" or "torch.distributed.DistBackendError"
  std::string message;     // str(exception)
  std::string traceback;   // the full formatted Python traceback
  std::string pickled;     // the pickled exception when it could be pickled, else empty
  double time = 0;         // seconds since the epoch when the rank caught it
};

// How a rank's process ended. The state machine of one rank:
//   pending → running → {succeeded | failed | stopped}; `stopped` means airhost ended it
//   during a teardown that another rank, the timeout or a signal to the host started.
enum class RankState { pending, running, succeeded, failed, stopped };

const char* to_string(RankState s) noexcept;

struct RankReport {
  int rank = 0;                        // global rank
  int local_rank = 0;
  int pid = 0;
  RankState state = RankState::pending;
  int exit_code = -1;                  // process exit status, or -1 if it died of a signal
  int term_signal = 0;                 // signal that killed it, 0 if none
  // Kind::function / pickled: the return value, pickled (or JSON text). Results of up to
  // 64 KiB always arrive here. Larger ones arrive as `result_blob`; unless the launch set
  // LaunchSpec::keep_result_descriptors, Launcher::run() turns each into bytes here too
  // (ResultBlob::to_string) and drops the blob, so `result` holds every result, as it always did.
  std::optional<std::string> result;
  // A result handed over by descriptor and kept as such (LaunchSpec::keep_result_descriptors);
  // null otherwise. Shared by copies of the report; the memory goes with the last of them.
  std::shared_ptr<const ResultBlob> result_blob;
  std::optional<ErrorRecord> error;    // the exception it raised, if it sent one
  std::string stdout_log;              // path of the full stdout log
  std::string stderr_log;              // path of the full stderr log
  double started_at = 0;               // seconds since the epoch
  double ended_at = 0;
};

enum class Outcome {
  succeeded,    // every rank exited 0
  failed,       // a rank failed; the others were stopped
  timed_out,    // the timeout stopped the run
  interrupted,  // a signal to the host or cancel() stopped the run
  not_started,  // the launch failed before any rank ran (see RunReport::message)
  node_lost,    // several nodes: another node failed, was stopped or lost, or never joined;
                // this node's ranks were stopped (or had succeeded: the job did not)
};

const char* to_string(Outcome o) noexcept;

struct RunReport {
  Outcome outcome = Outcome::not_started;
  int exit_code = 0;                 // airhost's exit code by the contract in exit_code.hpp
  int root_cause = -1;               // rank of the earliest failure, -1 if none
  int interrupt_signal = 0;          // the signal that interrupted the run, if any
  std::string hang;                  // a hang was seen (hang_timeout): its report's first line
  int warning_signal = 0;            // SIGUSR1 or SIGUSR2 the host got and passed to every rank: a
                                     // scheduler's warning that the job's time is nearly up; 0 if none
  std::string run_id;
  std::string run_dir;
  std::string message;               // one-sentence summary of what happened
  std::vector<RankReport> ranks;     // indexed by local rank; the last attempt's
  double wall_seconds = 0;           // the whole run, restarts included
  int restarts = 0;                  // how many times the group was restarted (LaunchSpec::max_restarts)
  std::vector<std::string> failed_attempts;  // the message of each attempt that was restarted
  // Each attempt of the run: the group it ran in and why it began (an elastic job's nodes come
  // and go between attempts).
  struct Attempt {
    int attempt = 0;
    int nnodes = 1;                  // the nodes in its group
    int node_rank = 0;               // this node's rank in it
    std::vector<std::string> nodes;  // node 0: every node of the group, "node 1 (gpu-b, 10.0.0.2)"
    std::string began;               // "the run started", or the message of the attempt before
  };
  std::vector<Attempt> attempts;
  bool warm = false;                 // the ranks were forked by a warm server
  std::string start_mode;            // one line: "warm start (...)" or "cold start (why not warm)"
  std::vector<std::string> incomplete_logs;  // each log that stops early (a full disk, a quota), and why
  std::vector<std::string> trimmed_logs;     // each log whose middle OutputOptions::log_max_bytes cut
  std::uint64_t unshown_bytes = 0;   // rank output the host's stdout/stderr reader did not take in
                                     // time (skipped, never blocking the run); all of it is in the logs
  std::string flight_recorder;       // a run that did not succeed, with torch's flight recorder dumps
                                     // in its stacks/: their summary (which collective, which rank
                                     // never entered it), a few lines; empty otherwise

  bool ok() const noexcept { return outcome == Outcome::succeeded; }
};

}  // namespace airhost
