// run_commands.cpp — `airhost runs [show ID]`, `airhost logs ID`, `airhost cancel ID`: the runs
// root read back (run_records.hpp), the same for runs of `airhost train.py`, of `submit` and of
// the Python API, since each leaves its run.json in its run directory.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "airhost/exit_code.hpp"
#include "airhost/launch.hpp"
#include "base/errors.hpp"
#include "base/util.hpp"
#include "cli/commands.hpp"
#include "cli/retention.hpp"
#include "cli/run_records.hpp"
#include "launch/run/run_dir.hpp"
#include "launch/run/run_report.hpp"

namespace airhost::detail {

namespace {

// These commands say what was wrong in one line: the id, the run's state, what to type.
int one_line_error(const std::string& message) {
  std::fprintf(stderr, "airhost: %s\n", message.c_str());
  return to_int(ExitCode::usage);
}

std::optional<long> parse_count(const std::string& text) {
  long v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v < 0) return std::nullopt;
  return v;
}

// `--flag VALUE` or `--flag=VALUE` at args[i]; advances i past the value.
std::string flag_value(const std::vector<std::string>& args, std::size_t& i, const std::string& name,
                       const std::string& example) {
  const std::string& a = args[i];
  if (a.size() > name.size() && a[name.size()] == '=') return a.substr(name.size() + 1);
  if (i + 1 >= args.size()) throw ConfigError(name + " needs a value, e.g. " + name + " " + example);
  return args[++i];
}

// How wide the table may be: the terminal's, when stdout is one; else COLUMNS; else no limit
// (a file, a pipe: every character kept).
std::size_t terminal_columns() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const std::string env = getenv_or("COLUMNS", "");
  return !env.empty() && env.find_first_not_of("0123456789") == std::string::npos ? std::stoul(env) : 0;
}

// The run `id` names, settled: the runs are listed as their run.json says, and only the one
// asked about is settled by what Slurm says (one squeue at most, shared_slurm_jobs()).
RunRecord find_run(const std::string& id) {
  const auto runs = list_runs(default_runs_root(), false);
  RunRecord run = resolve_run(runs, id, default_runs_root());
  settle(run);
  return run;
}

std::string ended_text(const RunRecord& r) {
  std::string s = r.state;
  if (r.exit_code) s += " (exit " + std::to_string(*r.exit_code) + ")";
  return s;
}

// ---- runs, runs show -----------------------------------------------------------------------

void show_ranks(const RunRecord& r) {
  for (const auto& k : r.ranks) {
    std::string how = k.state;
    if (k.signal) how += ", " + (k.signal_name.empty() ? "signal " + std::to_string(k.signal) : k.signal_name);
    else if (k.exit_code >= 0) how += ", exit " + std::to_string(k.exit_code);
    std::printf("  rank %d (node %d, local %d, pid %d): %s%s\n", k.rank, r.node_rank, k.local_rank, k.pid, how.c_str(),
                k.has_error ? (": " + k.error_type).c_str() : "");
    std::printf("    logs: %s\n          %s\n", k.stdout_log.c_str(), k.stderr_log.c_str());
  }
}

// The rank whose failure ended the run, with its traceback, from whichever node's record has it.
void show_root_cause(const std::vector<RunRecord>& nodes) {
  for (const auto& r : nodes)
    for (const auto& k : r.ranks) {
      if (k.rank != r.root_cause || k.state != "failed") continue;
      std::printf("root cause: rank %d (node %d)\n", k.rank, r.node_rank);
      if (k.has_error && !k.traceback.empty()) {
        std::fputs(k.traceback.c_str(), stdout);
        if (k.traceback.back() != '\n') std::fputc('\n', stdout);
      } else if (k.has_error) {
        std::printf("%s: %s\n", k.error_type.c_str(), k.error_message.c_str());
      } else {
        std::printf("  (no Python exception was reported; see the end of %s)\n", k.stderr_log.c_str());
      }
      return;
    }
}

// Node 0's record first, then node K's of a submitted several-node job (node-K/ inside it).
std::vector<RunRecord> node_records(const RunRecord& r) {
  std::vector<RunRecord> nodes = {r};
  const auto dirs = node_dirs(r.dir, r.nnodes);
  for (std::size_t i = 1; i < dirs.size(); ++i) {
    RunRecord k = read_run_record(dirs[i]);
    settle(k);
    nodes.push_back(std::move(k));
  }
  return nodes;
}

int show_run(const RunRecord& r, bool json) {
  const auto nodes = node_records(r);
  if (json) {
    std::string o = run_json_object(r, now_seconds());
    o.pop_back();  // the closing brace: the nodes follow
    o += ", \"nodes\": [";
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const auto& n = nodes[i];
      o += (i ? ", " : "") + std::string("{\"node_rank\": ") + std::to_string(n.node_rank) + ", \"state\": \"" +
           json_escape(n.state) + "\", \"exit_code\": " + (n.exit_code ? std::to_string(*n.exit_code) : "null") +
           ", \"run_dir\": \"" + json_escape(n.dir) + "\"}";
    }
    // Every rank of every node, as its node's record has it now (a live run's too).
    o += "], \"ranks\": [";
    bool first = true;
    for (const auto& n : nodes)
      for (const auto& k : n.ranks) {
        o += (first ? "" : ", ") + std::string("{\"rank\": ") + std::to_string(k.rank) + ", \"node\": " +
             std::to_string(n.node_rank) + ", \"local_rank\": " + std::to_string(k.local_rank) + ", \"pid\": " +
             std::to_string(k.pid) + ", \"state\": \"" + json_escape(k.state) + "\", \"exit_code\": " +
             (k.state == "pending" || k.state == "running" ? std::string("null") : std::to_string(k.exit_code)) +
             ", \"signal\": " + (k.signal_name.empty() ? std::string("null") : "\"" + json_escape(k.signal_name) + "\"") +
             ", \"error_type\": " + (k.has_error ? "\"" + json_escape(k.error_type) + "\"" : std::string("null")) + "}";
        first = false;
      }
    o += "]}\n";
    std::fputs(o.c_str(), stdout);
    return 0;
  }
  std::printf("run %s: %s\n", r.id.c_str(), ended_text(r).c_str());
  if (!r.message.empty()) std::printf("  %s\n", r.message.c_str());
  if (!r.problem.empty()) std::printf("  %s\n", r.problem.c_str());
  std::string entry = r.entry;
  for (const auto& a : r.args) entry += " " + shell_quote(a);
  std::printf("entry:     %s\n", entry.c_str());
  std::printf("nodes:     %d × %d rank(s)\n", r.nnodes, r.nprocs);
  if (r.host_pid) std::printf("host:      pid %d on %s\n", r.host_pid, r.hostname.empty() ? "?" : r.hostname.c_str());
  if (!r.scheduler_job_id.empty()) std::printf("slurm job: %s\n", r.scheduler_job_id.c_str());
  if (r.restarts) std::printf("restarts:  %d\n", r.restarts);
  // Each attempt's group, when nodes came or went between them (an elastic job), or restarts.
  bool regrouped = false;
  for (const auto& a : r.attempts) regrouped = regrouped || a.nnodes != r.attempts.front().nnodes;
  if (r.attempts.size() > 1 || regrouped)
    for (const auto& a : r.attempts) {
      std::printf("attempt %d: %d node(s), this one node %d", a.attempt, a.nnodes, a.node_rank);
      if (!a.nodes.empty()) {
        std::string names;
        for (std::size_t k = 0; k < a.nodes.size(); ++k) names += (k ? ", " : "") + a.nodes[k];
        std::printf(" (%s)", names.c_str());
      }
      std::printf("; began: %s\n", a.began.c_str());
    }
  if (r.bytes) std::printf("size:      %s%s\n", bytes_text(static_cast<double>(*r.bytes)).c_str(),
                          r.kept ? " (kept: never pruned)" : "");
  if (!r.hang.empty()) std::printf("hang:      %s\n", r.hang.c_str());
  if (!r.stacks.empty()) std::printf("stacks:    %s\n", r.stacks.c_str());
  std::printf("run dir:   %s\n", r.dir.c_str());
  // The MLflow run, when the launch made one (tracking.hpp writes its variables there).
  std::ifstream tracking(r.dir + "/tracking.env");
  for (std::string line; std::getline(tracking, line);)
    if (line.rfind("MLFLOW_RUN_ID=", 0) == 0) std::printf("mlflow:    run %s\n", line.substr(14).c_str());
  for (const auto& n : nodes) {
    if (nodes.size() > 1) {
      std::printf("node %d: %s", n.node_rank, ended_text(n).c_str());
      if (n.host_pid) std::printf(", host pid %d on %s", n.host_pid, n.hostname.empty() ? "?" : n.hostname.c_str());
      std::printf("\n");
    } else if (!n.ranks.empty()) {
      std::printf("ranks:\n");
    }
    show_ranks(n);
    std::printf("host log:  %s/logs/host.log\n", n.dir.c_str());
  }
  show_root_cause(nodes);
  return 0;
}

int runs_command(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "prune") return runs_prune_command({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "keep") return runs_keep_command({args.begin() + 1, args.end()});
  bool json = false;
  std::vector<std::string> words;
  for (const auto& a : args) {
    if (a == "--json") json = true;
    else if (a.size() > 1 && a[0] == '-') return one_line_error("unknown flag '" + a + "' for airhost runs; it takes --json, or show ID");
    else words.push_back(a);
  }
  if (words.empty()) {
    auto runs = list_runs(default_runs_root());
    for (auto& r : runs) measure_run(r);
    std::fputs((json ? runs_json(runs, now_seconds()) : runs_table(runs, now_seconds(), terminal_columns())).c_str(),
               stdout);
    return 0;
  }
  if (words[0] != "show")
    return one_line_error("airhost runs takes show ID, prune or keep ID (or nothing), got '" + words[0] +
                          "'; e.g. airhost runs show latest");
  if (words.size() != 2) return one_line_error("airhost runs show takes one run id, e.g. airhost runs show latest");
  RunRecord run = find_run(words[1]);
  measure_run(run);
  return show_run(run, json);
}

// ---- logs -----------------------------------------------------------------------------------

// One log file being printed: where it goes, how far it was read, an unfinished last line.
struct LogFile {
  std::string path;
  FILE* to;
  std::string prefix;
  off_t offset = 0;
  std::string partial;
};

// Prints what `f` holds past its offset, line by line with the prefix; an unfinished last line
// waits for its end unless `flush`.
void pump(LogFile& f, bool flush) {
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[1 << 16];
    ssize_t n;
    while ((n = ::pread(fd, buf, sizeof buf, f.offset)) > 0) {
      f.offset += n;
      f.partial.append(buf, static_cast<std::size_t>(n));
      std::size_t start = 0, nl;
      std::string out;
      while ((nl = f.partial.find('\n', start)) != std::string::npos) {
        out += f.prefix;
        out.append(f.partial, start, nl + 1 - start);
        start = nl + 1;
      }
      f.partial.erase(0, start);
      write_all(::fileno(f.to), out);
    }
    ::close(fd);
  }
  if (flush && !f.partial.empty()) {
    write_all(::fileno(f.to), f.prefix + f.partial + "\n");
    f.partial.clear();
  }
}

volatile sig_atomic_t g_stop_following = 0;
void on_follow_signal(int) { g_stop_following = 1; }

int logs_command(const std::vector<std::string>& args) {
  std::optional<std::string> id;
  std::optional<long> node, rank, tail;
  bool follow = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto count = [&](const std::string& name, const std::string& example) {
      const std::string v = flag_value(args, i, name, example);
      auto n = parse_count(v);
      if (!n) throw ConfigError(name + " must be a non-negative integer, got '" + v + "'; e.g. " + name + " " + example);
      return *n;
    };
    if (a == "--follow" || a == "-f") follow = true;
    else if (a == "--node" || a.rfind("--node=", 0) == 0) node = count("--node", "1");
    else if (a == "--rank" || a.rfind("--rank=", 0) == 0) rank = count("--rank", "3");
    else if (a == "--tail" || a.rfind("--tail=", 0) == 0) tail = count("--tail", "100");
    else if (a.size() > 1 && a[0] == '-')
      throw ConfigError("unknown flag '" + a + "' for airhost logs; it takes --node K, --rank R, --follow, --tail N");
    else if (id) throw ConfigError("airhost logs takes one run id, got '" + *id + "' and '" + a + "'");
    else id = a;
  }
  if (!id) throw ConfigError("airhost logs needs a run id, e.g. airhost logs latest (airhost runs lists them)");
  RunRecord run = find_run(*id);
  // A job of several nodes keeps each other node's record in node-K/ of its run directory.
  if (node && *node != run.node_rank && *node < run.nnodes) {
    RunRecord other = read_run_record(run.dir + "/node-" + std::to_string(*node));
    if (other.state == "unknown" || other.state == "starting")
      throw ConfigError("run " + run.id + " has no record of node " + std::to_string(*node) + " yet (" + run.dir +
                        "/node-" + std::to_string(*node) + "); try again once the job runs there");
    settle(other);
    run = other;
  }
  if (run.ranks.empty() && run.state == "unknown" && !run.problem.empty())
    throw ConfigError("cannot read run " + run.id + ": " + run.problem);
  if (run.ranks.empty()) throw ConfigError("run " + run.id + " has no rank logs yet (" + run.state + "); try again in a moment");
  if (node && *node != run.node_rank)
    throw ConfigError("run " + run.id + " holds the logs of node " + std::to_string(run.node_rank) + " only (" +
                      std::to_string(run.nnodes) + " node(s)); give --node " + std::to_string(run.node_rank) + " or leave it out");
  std::vector<const RankRecord*> chosen;
  for (const auto& k : run.ranks)
    if (!rank || k.rank == *rank) chosen.push_back(&k);
  if (chosen.empty())
    throw ConfigError("run " + run.id + " has ranks " + std::to_string(run.ranks.front().rank) + ".." +
                      std::to_string(run.ranks.back().rank) + " on node " + std::to_string(run.node_rank) + ", not rank " +
                      std::to_string(*rank) + "; give one of those to --rank");

  // A rank's stdout log goes to stdout and its stderr log to stderr; with several ranks each
  // line says whose it is, as on the console of the run.
  std::vector<LogFile> files;
  for (const auto* k : chosen) {
    const std::string prefix = chosen.size() > 1 ? "[rank " + std::to_string(k->rank) + "] " : "";
    files.push_back({k->stdout_log, stdout, prefix, 0, ""});
    files.push_back({k->stderr_log, stderr, prefix, 0, ""});
  }
  if (tail)
    for (auto& f : files) f.offset = tail_offset(f.path, *tail);
  std::fflush(nullptr);
  if (!follow) {
    bool any = false;
    for (auto& f : files) {
      struct stat st{};
      any = any || (::stat(f.path.c_str(), &st) == 0 && st.st_size > f.offset);
    }
    for (auto& f : files) pump(f, true);
    if (!any) {  // nothing printed: say so, rather than leave the reader wondering
      const bool live = run.state == "running" || run.state == "starting";
      const std::string who = (rank ? "rank " + std::to_string(*rank) + " of run " : std::string("run ")) + run.id;
      std::fprintf(stderr, "airhost: %s %s no output%s (logs: %s/logs)\n", who.c_str(),
                   live ? "has written" : "wrote", live ? " yet; airhost logs --follow waits for it" : "",
                   run.dir.c_str());
    }
    return 0;
  }
  // Following ends when the run does (or Ctrl-C: only this reader stops).
  struct sigaction sa{};
  sa.sa_handler = on_follow_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  while (!g_stop_following) {
    for (auto& f : files) pump(f, false);
    RunRecord now = read_run_record(run.dir);
    settle(now);
    if (now.state != "running" && now.state != "starting") {
      for (auto& f : files) pump(f, true);  // what was written before run.json said it ended
      if (now.state == "lost" || now.state == "unknown")
        std::fprintf(stderr, "airhost: run %s: %s\n", now.id.c_str(), now.problem.c_str());
      return 0;
    }
    ::poll(nullptr, 0, 200);
  }
  for (auto& f : files) pump(f, true);
  return 0;
}

// ---- cancel ---------------------------------------------------------------------------------

// A run of a job that `airhost submit --to slurm` queued (its batch script is in the run dir).
bool run_is_ours_under_slurm(const RunRecord& run) { return ::access((run.dir + "/slurm.sbatch").c_str(), F_OK) == 0; }

int cancel_slurm(const RunRecord& run) {
  try {
    write_file_atomic(run.dir + "/" + kCancelRequestFile,
                      "{\"pid\": " + std::to_string(::getpid()) + ", \"time\": " + std::to_string(now_seconds()) + "}\n");
  } catch (const std::exception& e) {
    throw ConfigError(std::string(e.what()) + "; cancel needs to write into the run directory");
  }
  std::string out;
  if (run_capture("scancel " + shell_quote(run.scheduler_job_id) + " 2>&1", out) != 0) {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    throw ConfigError("scancel refused Slurm job " + run.scheduler_job_id + " of run " + run.id + ": " + out);
  }
  std::fprintf(stderr, "airhost: run %s: asked Slurm to cancel job %s\n", run.id.c_str(), run.scheduler_job_id.c_str());
  const double deadline = now_seconds() + 120;
  double gone_since = 0;
  while (now_seconds() < deadline) {
    RunRecord now = read_run_record(run.dir);
    const bool queued = slurm_job_active(run.scheduler_job_id).value_or(false);
    if (!queued && gone_since == 0) gone_since = now_seconds();
    // Slurm is done with the job, but no host recorded the end: it never started (pending), or
    // Slurm's SIGKILL came before its host could write it. The record says it here.
    if (!queued && (now.state == "pending" || now.state == "requeued" || (!is_ended(now.state) && now_seconds() - gone_since > 5))) {
      std::ifstream in(run.dir + "/run.json");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (const char* was : {"\"state\": \"pending\"", "\"state\": \"running\"", "\"state\": \"requeued\""})
        if (const auto at = text.find(was); at != std::string::npos)
          text.replace(at, std::strlen(was), "\"state\": \"cancelled\"");
      try {
        write_file_atomic(run.dir + "/run.json", text);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "airhost: run %s: %s\n", run.id.c_str(), e.what());
      }
      std::fprintf(stderr, "airhost: run %s cancelled %s\n", run.id.c_str(),
                   now.state == "pending" ? "before it started" : "(Slurm stopped its hosts before they recorded it)");
      return 0;
    }
    if (is_ended(now.state) || now.state == "lost") {
      std::fprintf(stderr, "airhost: run %s %s\n", run.id.c_str(),
                   now.state == "cancelled" ? ("cancelled" + std::string(now.exit_code ? " (exit " + std::to_string(*now.exit_code) + ")" : "")).c_str()
                                             : ("ended " + ended_text(now)).c_str());
      return 0;
    }
    ::poll(nullptr, 0, 200);
  }
  std::fprintf(stderr, "airhost: run %s: Slurm job %s has not ended after 120 s; airhost runs shows when it has\n",
               run.id.c_str(), run.scheduler_job_id.c_str());
  return to_int(ExitCode::generic_failure);
}

int cancel_command(const std::vector<std::string>& args) {
  std::optional<std::string> id;
  for (const auto& a : args) {
    if (a.size() > 1 && a[0] == '-') throw ConfigError("unknown flag '" + a + "' for airhost cancel; it takes a run id alone");
    if (id) throw ConfigError("airhost cancel takes one run id, got '" + *id + "' and '" + a + "'");
    id = a;
  }
  if (!id) throw ConfigError("airhost cancel needs a run id, e.g. airhost cancel latest (airhost runs lists them)");
  const RunRecord run = find_run(*id);
  if (is_ended(run.state))
    throw ConfigError("run " + run.id + " has already ended: " + ended_text(run) + "; nothing to cancel");
  if (run.state == "lost") throw ConfigError("run " + run.id + " is not running: " + run.problem + "; nothing to cancel");
  if (run.state == "starting")
    throw ConfigError("run " + run.id + " is starting (no run.json yet); cancel it again in a moment");
  if (run.state == "unknown" && !run.scheduler_job_id.empty() && run_is_ours_under_slurm(run)) return cancel_slurm(run);
  if (run.state == "unknown")
    throw ConfigError("cannot tell whether run " + run.id + " runs: " + run.problem +
                      (run.hostname.empty() ? "" : "; cancel it on " + run.hostname));
  // A Slurm job of ours: Slurm signals every node's airhost (scancel), each stopping its ranks by
  // the same contract, and cancels a job still queued outright.
  if (!run.scheduler_job_id.empty() && (run.state == "pending" || run_is_ours_under_slurm(run)))
    return cancel_slurm(run);
  if (!run.host_handles_signals)
    throw ConfigError("run " + run.id + " belongs to a program embedding airhost (the Python API, pid " +
                      std::to_string(run.host_pid) + "), which keeps its own signals; cancel it there (Ctrl-C, or "
                      "cancel() on its future)");

  // The request first, so that the host, ending interrupted by our SIGTERM, records "cancelled".
  try {
    write_file_atomic(run.dir + "/" + kCancelRequestFile,
                      "{\"pid\": " + std::to_string(::getpid()) + ", \"time\": " + std::to_string(now_seconds()) + "}\n");
  } catch (const std::exception& e) {
    throw ConfigError(std::string(e.what()) + "; cancel needs to write into the run directory");
  }
  // SIGTERM to the host: it stops every rank by its contract (SIGTERM, the grace period,
  // then SIGKILL) and writes run.json as it ends.
  if (::kill(run.host_pid, SIGTERM) != 0 && errno != ESRCH)
    throw ConfigError("cannot signal run " + run.id + "'s host (pid " + std::to_string(run.host_pid) +
                      "): " + std::strerror(errno));
  std::fprintf(stderr, "airhost: run %s: asked its host (pid %d) to stop its ranks\n", run.id.c_str(), run.host_pid);
  const double deadline = now_seconds() + 120;
  while (now_seconds() < deadline) {
    RunRecord now = read_run_record(run.dir);
    settle(now);
    if (now.state != "running") {
      if (now.state == "lost") {
        std::fprintf(stderr, "airhost: run %s: its host is gone without recording the end\n", run.id.c_str());
        return to_int(ExitCode::generic_failure);
      }
      std::fprintf(stderr, "airhost: run %s %s\n", run.id.c_str(),
                   now.state == "cancelled" ? ("cancelled" + std::string(now.exit_code ? " (exit " + std::to_string(*now.exit_code) + ")" : "")).c_str()
                                             : ("ended " + ended_text(now) + " before the cancel reached it").c_str());
      return 0;
    }
    ::poll(nullptr, 0, 100);
  }
  std::fprintf(stderr, "airhost: run %s: its host (pid %d) is still stopping its ranks after 120 s; airhost runs shows when it has\n",
               run.id.c_str(), run.host_pid);
  return to_int(ExitCode::generic_failure);
}

}  // namespace

// Read backwards from the end in blocks: memory stays one block and the time follows the
// lines asked for, not the log's size (it read the whole file, 3.9 GB for a 3 GiB log).
off_t tail_offset(const std::string& path, long lines) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return 0;
  }
  const off_t size = st.st_size;
  if (lines <= 0 || size == 0) {
    ::close(fd);
    return lines <= 0 ? size : 0;
  }
  constexpr off_t kBlock = 64 * 1024;
  std::vector<char> block(kBlock);
  off_t end = size;
  char last = 0;
  if (::pread(fd, &last, 1, size - 1) == 1 && last == '\n') --end;  // the final newline ends the last line
  long seen = 0;
  off_t found = 0;
  while (end > 0) {
    const off_t start = end > kBlock ? end - kBlock : 0;
    const auto want = static_cast<size_t>(end - start);
    size_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, block.data() + got, want - got, start + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got < want) break;  // the file shrank under us: from its start
    for (size_t i = want; i-- > 0;) {
      if (block[i] == '\n' && ++seen == lines) {
        found = start + static_cast<off_t>(i) + 1;
        ::close(fd);
        return found;
      }
    }
    end = start;
  }
  ::close(fd);
  return 0;
}

bool is_run_command(const std::string& word) {
  return word == "runs" || word == "logs" || word == "cancel" || word == "stacks";
}

int run_command(const std::string& word, const std::vector<std::string>& args) {
  try {
    if (word == "runs") return runs_command(args);
    if (word == "logs") return logs_command(args);
    if (word == "stacks") return stacks_command(args);
    return cancel_command(args);
  } catch (const ConfigError& e) {
    return one_line_error(e.what());
  }
}

}  // namespace airhost::detail
