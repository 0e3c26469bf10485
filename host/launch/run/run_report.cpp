#include <cstdio>
#include <fstream>
#include <sstream>

#include "launch/run/run_report.hpp"

#include <algorithm>
#include <limits>

#include <unistd.h>

#include "airhost/exit_code.hpp"
#include "base/util.hpp"
#include "launch/procs/proc_tree.hpp"

namespace airhost {

const char* to_string(RankState s) noexcept {
  switch (s) {
    case RankState::pending: return "pending";
    case RankState::running: return "running";
    case RankState::succeeded: return "succeeded";
    case RankState::failed: return "failed";
    case RankState::stopped: return "stopped";
  }
  return "unknown";
}

const char* to_string(Outcome o) noexcept {
  switch (o) {
    case Outcome::succeeded: return "succeeded";
    case Outcome::failed: return "failed";
    case Outcome::timed_out: return "timed_out";
    case Outcome::interrupted: return "interrupted";
    case Outcome::not_started: return "not_started";
    case Outcome::node_lost: return "node_lost";
  }
  return "unknown";
}

}  // namespace airhost

namespace airhost::detail {
namespace {


std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

const char* kind_name(Entry::Kind k) {
  switch (k) {
    case Entry::Kind::script: return "script";
    case Entry::Kind::module: return "module";
    case Entry::Kind::function: return "function";
    case Entry::Kind::pickled: return "pickled";
  }
  return "unknown";
}

// The last `lines` lines of a log: what a rank said before it died without an exception.
std::string log_tail(const std::string& path, std::size_t lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > 8192 ? size - 8192 : 0;
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t end = text.size();
  if (end && text[end - 1] == '\n') --end;  // the final newline ends the last line, it starts none
  std::size_t begin = end, seen = 0;
  while (begin > 0 && !(text[begin - 1] == '\n' && ++seen == lines)) --begin;
  return text.substr(begin);
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

}  // namespace

std::string describe_exit(const RankReport& r) {
  if (r.term_signal) return signal_name(r.term_signal) + " (signal " + std::to_string(r.term_signal) + ")";
  if (r.exit_code >= 0) return "exit " + std::to_string(r.exit_code);
  return to_string(r.state);
}

bool is_lost_peer_error(const ErrorRecord& e) {
  if (e.type.ends_with("DistNetworkError")) return true;
  for (const char* words : {"Connection closed by peer", "Connection reset by peer", "remote worker crashing",
                            "NCCL communicator was aborted", "Broken pipe"})
    if (e.message.find(words) != std::string::npos) return true;
  return false;
}

namespace {
void conclude_outcome(RunReport& rep, const TeardownCause& cause, const std::vector<bool>& signalled) {
  // The root cause is the earliest failure: the time its exception was caught, or its exit
  // when it raised none (a segfault, os._exit). Cascading failures come later, with one
  // exception: a peer's death reaches the other ranks' sockets at once, while the host learns
  // of it only when SIGCHLD is handled, so "connection closed by peer" can carry an earlier
  // time than the crash that caused it. Such errors are the root cause only when nothing else
  // failed.
  double earliest = std::numeric_limits<double>::infinity();
  bool earliest_is_cascade = true;
  for (auto& r : rep.ranks) {
    if (r.state != RankState::failed) continue;
    const double t = r.error ? std::min(r.error->time, r.ended_at) : r.ended_at;
    const bool cascade = r.error && is_lost_peer_error(*r.error);
    if ((earliest_is_cascade && !cascade) || (cascade == earliest_is_cascade && t < earliest)) {
      earliest = t;
      earliest_is_cascade = cascade;
      rep.root_cause = r.rank;
    }
  }

  const std::string run = "run " + rep.run_id;
  if (!cause.torn_down) {
    rep.outcome = Outcome::succeeded;
    rep.exit_code = to_int(ExitCode::ok);
    rep.message = run + ": " + std::to_string(rep.ranks.size()) + " rank(s) succeeded";
  } else if (cause.reason == Outcome::timed_out) {
    rep.outcome = Outcome::timed_out;
    rep.exit_code = to_int(ExitCode::timeout);
    rep.message = !cause.hang.empty()
                      ? run + " hung (" + cause.hang + "); every rank was stopped (--on-hang stop; the stacks are in " +
                            "the run directory's stacks/)"
                      : run + " timed out after " + std::to_string(cause.timeout_seconds) +
                            " s; every rank was stopped (raise --timeout, or 0 to disable it)";
  } else if (cause.reason == Outcome::node_lost) {
    // Whatever this node's ranks raised after that came from the other node's loss.
    rep.outcome = Outcome::node_lost;
    rep.exit_code = to_int(ExitCode::node_lost);
    rep.root_cause = -1;
    rep.message = run + ": " + cause.node_lost_why + "; this node's ranks were stopped";
  } else if (cause.reason == Outcome::interrupted) {
    rep.outcome = Outcome::interrupted;
    rep.exit_code = exit_code_for_signal(cause.interrupt_signal);
    rep.message = run + " was interrupted by " + signal_name(cause.interrupt_signal) + "; every rank was stopped";
  } else {
    rep.outcome = Outcome::failed;
    const RankReport* root = nullptr;
    for (auto& r : rep.ranks)
      if (r.rank == rep.root_cause) root = &r;
    if (root) {
      // A rank that raised but was ended by our own teardown signal (its interpreter was
      // still shutting down) exits as python does for an unhandled exception: 1.
      const bool ours = root->local_rank >= 0 && static_cast<std::size_t>(root->local_rank) < signalled.size() &&
                        signalled[static_cast<std::size_t>(root->local_rank)];
      const bool our_signal = root->term_signal && root->error && ours;
      rep.exit_code = our_signal ? 1 : root->term_signal ? exit_code_for_signal(root->term_signal) : root->exit_code;
      rep.message = run + " failed: rank " + std::to_string(root->rank) +
                    (our_signal ? " raised an exception (the teardown ended it while it shut down)"
                     : root->term_signal ? " was killed by " + signal_name(root->term_signal)
                                         : " exited with code " + std::to_string(root->exit_code));
      if (root->error) {
        const auto& m = root->error->message;
        rep.message += " (" + root->error->type + ": " + m.substr(0, std::min(m.find('\n'), std::size_t{200})) + ")";
      }
    } else {
      rep.exit_code = to_int(ExitCode::generic_failure);
      rep.message = run + " failed" + (cause.host_error.empty() ? "" : ": " + cause.host_error) +
                    (cause.host_error.empty() ? "" : "; every rank was stopped");
    }
  }
}
}  // namespace

void conclude_run(RunReport& rep, const TeardownCause& cause, const std::vector<bool>& signalled) {
  conclude_outcome(rep, cause, signalled);
  if (rep.warning_signal && !rep.ok()) {
    // Stopping is what the scheduler's warning asked for: the run says so before how its ranks left.
    const std::string run = "run " + rep.run_id;
    std::string how = rep.message.rfind(run, 0) == 0 ? rep.message.substr(run.size()) : rep.message;
    while (!how.empty() && (how.front() == ':' || how.front() == ' ')) how.erase(0, 1);
    rep.message = run + " stopped after the scheduler's warning (" + signal_name(rep.warning_signal) + "): " + how;
  }
}

RankReport live_record(const RankReport& was) {
  RankReport k;
  k.rank = was.rank, k.local_rank = was.local_rank, k.pid = was.pid, k.state = was.state;
  k.exit_code = was.exit_code, k.term_signal = was.term_signal, k.error = was.error;
  k.stdout_log = was.stdout_log, k.stderr_log = was.stderr_log;
  k.started_at = was.started_at, k.ended_at = was.ended_at;
  if (was.result || was.result_blob) k.result.emplace();  // has_result, not the bytes
  return k;
}

namespace {

// Who runs the run, and where: what a reader needs to tell a live run from one whose host died
// without writing its end (the pid alone could be another process's by then: its start time
// too), and whether `airhost cancel` may end it by a SIGTERM (an embedding program or the
// Python API keep their signals: they cancel through their own calls).
void host_fields(std::ostringstream& o, const LaunchSpec& spec, double started_at, double ended_at) {
  ProcStat self;
  const bool have_stat = read_proc_stat(static_cast<int>(::getpid()), self);
  char hostname[256] = "";
  ::gethostname(hostname, sizeof hostname - 1);
  const std::string job = getenv_or("SLURM_JOB_ID", "");
  o << ",\n  \"started_at\": " << number(started_at) << ",\n  \"ended_at\": "
    << (ended_at > 0 ? number(ended_at) : "null") << ",\n  \"host_pid\": " << ::getpid()
    << ",\n  \"host_start_ticks\": " << (have_stat ? self.start : 0) << ",\n  \"hostname\": " << json_quoted(hostname)
    << ",\n  \"host_handles_signals\": " << (spec.handle_signals ? "true" : "false")
    << ",\n  \"scheduler_job_id\": " << (job.empty() ? "null" : json_quoted(job));
}

void entry_fields(std::ostringstream& o, const LaunchSpec& spec) {
  o << ",\n  \"max_restarts\": " << spec.max_restarts << ",\n  \"entry\": {\"kind\": "
    << json_quoted(kind_name(spec.entry.kind)) << ", \"target\": " << json_quoted(spec.entry.target) << ", \"function\": "
    << json_quoted(spec.entry.function) << ", \"args\": [";
  for (std::size_t i = 0; i < spec.entry.args.size(); ++i) o << (i ? ", " : "") << json_quoted(spec.entry.args[i]);
  // Beside "entry", not in it: readers compare that object whole. `train.py:main` and
  // `-m pkg:main` are both kind "function"; this tells them apart for `airhost runs`.
  o << "]},\n  \"entry_is_module\": " << (spec.entry.module_target ? "true" : "false") << ",\n  \"nprocs\": " << spec.nprocs << ",\n  \"nnodes\": " << spec.nnodes << ",\n  \"node_rank\": "
    << spec.node_rank;
}

bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// `airhost cancel` leaves its request in the run's directory; a node K > 0 of a submitted
// Slurm job keeps its record in node-K/ of that directory.
bool cancel_requested(const std::string& run_dir, int node_rank) {
  if (file_exists(run_dir + "/" + kCancelRequestFile)) return true;
  return node_rank > 0 && run_dir.ends_with("/node-" + std::to_string(node_rank)) &&
         file_exists(dirname_of(run_dir) + "/" + kCancelRequestFile);
}

}  // namespace

std::string final_state(Outcome outcome, bool cancel_requested, bool warned, bool requeue) {
  // Whatever ended a run that was asked to stop is the cancel: under Slurm, scancel signals
  // every process of the step at once, so a rank may die of it before the host hears of it,
  // and the run ends "failed" by a rank's SIGTERM rather than "interrupted".
  if (cancel_requested && outcome != Outcome::succeeded) return "cancelled";
  // After the scheduler's warning, however the ranks left (airhost.Preempted, a SIGTERM at the
  // time limit), the run stopped for the job's time, to be resumed from its checkpoint.
  // One that its caller requeues says so from the start: never "preempted" (an end) before.
  if (warned && outcome != Outcome::succeeded) return requeue ? "requeued" : "preempted";
  return to_string(outcome);
}

namespace {

void rank_fields(std::ostringstream& o, const RankReport& r) {
  o << "{\"rank\": " << r.rank << ", \"local_rank\": " << r.local_rank << ", \"pid\": " << r.pid
    << ", \"state\": " << json_quoted(to_string(r.state)) << ", \"exit_code\": " << r.exit_code << ", \"signal\": " << r.term_signal
    << ", \"signal_name\": " << (r.term_signal ? json_quoted(signal_name(r.term_signal)) : "null") << ", \"has_result\": "
    << (r.result || r.result_blob ? "true" : "false") << ", \"started_at\": " << number(r.started_at)
    << ", \"ended_at\": " << number(r.ended_at) << ", \"stdout_log\": " << json_quoted(r.stdout_log)
    << ", \"stderr_log\": " << json_quoted(r.stderr_log) << ", \"error\": ";
  if (r.error) {
    o << "{\"type\": " << json_quoted(r.error->type) << ", \"message\": " << json_quoted(r.error->message)
      << ", \"time\": " << number(r.error->time) << ", \"traceback\": " << json_quoted(r.error->traceback) << "}";
  } else {
    o << "null";
  }
  o << "}";
}

}  // namespace

std::string run_json_started(const LaunchSpec& spec, double started_at, const std::vector<RankReport>& ranks,
                             int restarts, const std::vector<std::string>& failed_attempts) {
  std::ostringstream o;
  o << "{\n  \"run_id\": " << json_quoted(spec.run_id) << ",\n  \"run_dir\": " << json_quoted(spec.run_dir)
    << ",\n  \"state\": \"running\",\n  \"outcome\": null,\n  \"exit_code\": null,\n  \"root_cause\": -1"
    << ",\n  \"message\": " << json_quoted("run " + spec.run_id + " is running") << ",\n  \"wall_seconds\": 0"
    << ",\n  \"restarts\": " << (restarts >= 0 ? restarts : spec.restart_offset) << ",\n  \"failed_attempts\": [";
  for (std::size_t i = 0; i < failed_attempts.size(); ++i) o << (i ? ", " : "") << json_quoted(failed_attempts[i]);
  o << "]";
  host_fields(o, spec, started_at, 0);
  entry_fields(o, spec);
  o << ",\n  \"ranks\": [";
  if (!ranks.empty()) {
    for (std::size_t i = 0; i < ranks.size(); ++i) o << (i ? "," : "") << "\n    ", rank_fields(o, ranks[i]);
  } else {
    // The ranks to be: where their logs will be, so that `airhost logs` can follow them now.
    for (int i = 0; i < spec.nprocs; ++i) {
      RankReport r;
      r.rank = spec.node_rank * spec.nprocs + i;
      r.local_rank = i;
      const std::string base = spec.run_dir + "/logs/rank-" + std::to_string(r.rank);
      r.stdout_log = base + ".stdout.log";
      r.stderr_log = base + ".stderr.log";
      o << (i ? "," : "") << "\n    ", rank_fields(o, r);
    }
  }
  o << "\n  ]\n}\n";
  return o.str();
}

std::string run_json(const RunReport& report, const LaunchSpec& spec, double started_at) {
  std::ostringstream o;
  const std::string run_dir = report.run_dir.empty() ? spec.run_dir : report.run_dir;
  const std::string state = final_state(report.outcome, cancel_requested(run_dir, spec.node_rank),
                                        report.warning_signal != 0, spec.requeue_when_preempted);
  // What ended it, in the record's words: a cancel's SIGTERM is the cancel, not an interrupt.
  const std::string message = state == "cancelled" && report.outcome == Outcome::interrupted
                                  ? "run " + report.run_id + " was cancelled (airhost cancel); every rank was stopped"
                                  : report.message;
  o << "{\n  \"run_id\": " << json_quoted(report.run_id) << ",\n  \"run_dir\": " << json_quoted(report.run_dir)
    << ",\n  \"state\": " << json_quoted(state)
    << ",\n  \"outcome\": " << json_quoted(to_string(report.outcome)) << ",\n  \"exit_code\": " << report.exit_code
    << ",\n  \"root_cause\": " << report.root_cause << ",\n  \"message\": " << json_quoted(message)
    << ",\n  \"wall_seconds\": " << number(report.wall_seconds) << ",\n  \"restarts\": " << report.restarts
    << ",\n  \"hang\": " << (report.hang.empty() ? std::string("null") : json_quoted(report.hang))
    << ",\n  \"warning_signal\": " << (report.warning_signal ? json_quoted(signal_name(report.warning_signal)) : "null")
    << ",\n  \"incomplete_logs\": [";
  for (std::size_t i = 0; i < report.incomplete_logs.size(); ++i) o << (i ? ", " : "") << json_quoted(report.incomplete_logs[i]);
  o << "],\n  \"trimmed_logs\": [";
  for (std::size_t i = 0; i < report.trimmed_logs.size(); ++i) o << (i ? ", " : "") << json_quoted(report.trimmed_logs[i]);
  o << "]"
    << ",\n  \"failed_attempts\": [";
  for (std::size_t i = 0; i < report.failed_attempts.size(); ++i) o << (i ? ", " : "") << json_quoted(report.failed_attempts[i]);
  o << "],\n  \"attempts\": [";
  for (std::size_t i = 0; i < report.attempts.size(); ++i) {
    const auto& a = report.attempts[i];
    o << (i ? "," : "") << "\n    {\"attempt\": " << a.attempt << ", \"nnodes\": " << a.nnodes << ", \"node_rank\": "
      << a.node_rank << ", \"nodes\": [";
    for (std::size_t k = 0; k < a.nodes.size(); ++k) o << (k ? ", " : "") << json_quoted(a.nodes[k]);
    o << "], \"began\": " << json_quoted(a.began) << "}";
  }
  o << (report.attempts.empty() ? "]" : "\n  ]");
  host_fields(o, spec, started_at, started_at + report.wall_seconds);
  entry_fields(o, spec);
  o << ",\n  \"ranks\": [";
  for (std::size_t i = 0; i < report.ranks.size(); ++i) o << (i ? "," : "") << "\n    ", rank_fields(o, report.ranks[i]);
  o << "\n  ]\n}\n";
  return o.str();
}

std::string no_gpu_hint(const RunReport& report, const LaunchSpec& spec) {
  if (report.ok() || !spec.devices.empty()) return {};
  const RankReport* root = nullptr;
  for (const auto& r : report.ranks)
    if (r.rank == report.root_cause || (!root && r.state == RankState::failed && r.error)) root = &r;
  if (!root || !root->error) return {};
  const std::string text = root->error->type + ": " + root->error->message + "\n" + root->error->traceback;
  static const char* const kSigns[] = {"_cuda_", "CUDA", "cuda(", "torch.cuda", ".cuda()", "NCCL", "nccl",
                                       "Torch not compiled with CUDA", "no CUDA GPUs are available"};
  bool gpu = false;
  for (const char* sign : kSigns) gpu = gpu || text.find(sign) != std::string::npos;
  if (!gpu) return {};
  const int n = static_cast<int>(report.ranks.size());
  return "this node has no GPU that airhost could find, so it ran " + std::to_string(n) + " CPU rank" +
         (n == 1 ? "" : "s") + ", and rank " + std::to_string(root->rank) +
         " failed calling CUDA or NCCL: run it on a GPU node, or use the gloo backend and the CPU device here";
}

std::string failure_summary(const RunReport& report) {
  if (report.ok()) return {};
  std::ostringstream o;
  o << "airhost: " << report.message << "\n";
  bool header = false;
  for (const auto& r : report.ranks) {
    if (r.state != RankState::failed) continue;
    if (!header) {
      o << "Failed ranks:\n";
      header = true;
    }
    o << "  rank " << r.rank << " (pid " << r.pid << "): " << describe_exit(r);
    if (r.error) o << ": " << r.error->type << ": " << first_line(r.error->message);
    o << "\n    log: " << r.stderr_log << "\n";
  }
  int stopped = 0;
  for (const auto& r : report.ranks) stopped += r.state == RankState::stopped;
  if (stopped) o << "Stopped by airhost: " << stopped << " rank" << (stopped > 1 ? "s" : "") << "\n";
  if (report.root_cause >= 0) {
    for (const auto& r : report.ranks) {
      if (r.rank != report.root_cause) continue;
      o << "Root cause: rank " << r.rank << " (pid " << r.pid << "), " << describe_exit(r) << "\n";
      if (r.error && !r.error->traceback.empty()) {
        o << r.error->traceback;
        if (r.error->traceback.back() != '\n') o << "\n";
      } else {
        const std::string tail = log_tail(r.stderr_log, 20);
        o << "  (no Python exception was reported; the end of " << r.stderr_log << " follows)\n";
        if (!tail.empty()) o << tail << (tail.back() == '\n' ? "" : "\n");
      }
    }
  }
  o << report.flight_recorder;
  o << "Run directory: " << report.run_dir << " (run.json, logs/)\n";
  return o.str();
}

}  // namespace airhost::detail
