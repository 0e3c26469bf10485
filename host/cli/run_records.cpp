// run_records.cpp — run.json read back (see run_records.hpp).
#include "cli/run_records.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "base/errors.hpp"
#include "base/json_value.hpp"
#include "base/util.hpp"
#include "launch/procs/proc_tree.hpp"
#include "airhost/launch.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {

namespace {

std::string entry_text(const JsonValue& e, bool module) {
  const std::string kind = e["kind"].str(), target = e["target"].str(), function = e["function"].str();
  if (kind == "script") return target;
  if (kind == "module") return "-m " + target;
  if (kind == "function") return (module ? "-m " : "") + target + ":" + function;
  if (kind == "pickled") return function.empty() ? "(Python API)" : function + "() (Python API)";
  return target;
}

std::string read_text(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  return ok ? std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) : std::string();
}


std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string local_time(double t) {
  return t <= 0 ? "-" : local_time_text(t, "%Y-%m-%d %H:%M:%S");
}

double duration_of(const RunRecord& r, double now) {
  if (r.ended_at > 0) return r.wall_seconds > 0 ? r.wall_seconds : r.ended_at - r.started_at;
  if (r.state == "running" && r.started_at > 0) return std::max(0.0, now - r.started_at);
  return -1;
}

}  // namespace

RunRecord parse_run_record(const std::string& dir, const std::string& json_text) {
  RunRecord r;
  r.dir = dir;
  r.id = dir.substr(dir.find_last_of('/') + 1);
  JsonValue j;
  try {
    j = JsonValue::parse(json_text);
  } catch (const JsonError& e) {
    // Written whole or not at all (atomically): a record that does not parse stays so.
    r.state = "unknown";
    r.problem = "its record " + dir + "/run.json is corrupt (" + e.what() + ")";
    return r;
  }
  r.id = j["run_id"].str(r.id);
  // Records written before run.json had a state carry only the outcome.
  r.state = j["state"].str(j["outcome"].str("unknown"));
  if (j["exit_code"].type() == JsonValue::Type::number) r.exit_code = static_cast<int>(j["exit_code"].integer());
  r.root_cause = static_cast<int>(j["root_cause"].integer(-1));
  r.message = j["message"].str();
  r.hang = j["hang"].str();
  // Where each rank was, last time the host asked (a hang, a timeout, a failure, Ctrl-\\).
  if (DIR* d = ::opendir((dir + "/stacks").c_str())) {
    std::string newest;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0 && name.rfind("sample-", 0) != 0 &&
          name > newest)
        newest = name;  // named by their time: the greatest is the newest
    }
    ::closedir(d);
    if (!newest.empty()) r.stacks = dir + "/stacks/" + newest;
  }
  r.started_at = j["started_at"].num();
  r.ended_at = j["ended_at"].num();
  r.wall_seconds = j["wall_seconds"].num();
  r.restarts = static_cast<int>(j["restarts"].integer());
  for (const auto& a : j["attempts"].items()) {
    RunRecord::Attempt at;
    at.attempt = static_cast<int>(a["attempt"].integer());
    at.nnodes = static_cast<int>(a["nnodes"].integer(1));
    at.node_rank = static_cast<int>(a["node_rank"].integer());
    for (const auto& n : a["nodes"].items()) at.nodes.push_back(n.str());
    at.began = a["began"].str();
    r.attempts.push_back(std::move(at));
  }
  r.host_pid = static_cast<int>(j["host_pid"].integer());
  r.host_start_ticks = static_cast<std::uint64_t>(j["host_start_ticks"].num());
  r.hostname = j["hostname"].str();
  r.host_handles_signals = j["host_handles_signals"].boolean();
  r.scheduler_job_id = j["scheduler_job_id"].str();
  r.entry = entry_text(j["entry"], j["entry_is_module"].boolean());
  // A job still queued has no launch resolved yet: what was typed after `airhost submit`.
  for (const auto& word : j["launch"].items()) r.entry += (r.entry.empty() ? "" : " ") + word.str();
  for (const auto& a : j["entry"]["args"].items()) r.args.push_back(a.str());
  r.nprocs = static_cast<int>(j["nprocs"].integer());
  r.nnodes = static_cast<int>(j["nnodes"].integer(1));
  r.node_rank = static_cast<int>(j["node_rank"].integer());
  for (const auto& x : j["ranks"].items()) {
    RankRecord k;
    k.rank = static_cast<int>(x["rank"].integer());
    k.local_rank = static_cast<int>(x["local_rank"].integer());
    k.pid = static_cast<int>(x["pid"].integer());
    k.state = x["state"].str();
    k.exit_code = static_cast<int>(x["exit_code"].integer(-1));
    k.signal = static_cast<int>(x["signal"].integer());
    k.signal_name = x["signal_name"].str();
    k.stdout_log = x["stdout_log"].str();
    k.stderr_log = x["stderr_log"].str();
    if (x["error"].type() == JsonValue::Type::object) {
      k.has_error = true;
      k.error_type = x["error"]["type"].str();
      k.error_message = x["error"]["message"].str();
      k.traceback = x["error"]["traceback"].str();
    }
    r.ranks.push_back(std::move(k));
  }
  return r;
}

RunRecord read_run_record(const std::string& dir) {
  bool ok = false;
  const std::string text = read_text(dir + "/run.json", ok);
  if (ok) return parse_run_record(dir, text);
  RunRecord r;
  r.dir = dir;
  r.id = dir.substr(dir.find_last_of('/') + 1);
  // A submit makes the directory a moment before its host writes run.json; an old directory
  // without one is a run that never got that far (or something else).
  struct stat st{};
  const bool recent = ::stat(dir.c_str(), &st) == 0 && now_seconds() - static_cast<double>(st.st_mtime) < 60;
  r.state = recent ? "starting" : "unknown";
  r.started_at = ::stat(dir.c_str(), &st) == 0 ? static_cast<double>(st.st_mtime) : 0;
  if (!recent) r.problem = "no run.json in " + dir;
  return r;
}

bool is_ended(const std::string& state) {
  return state != "running" && state != "starting" && state != "pending" && state != "requeued" && state != "lost" &&
         state != "unknown";
}

void settle(RunRecord& r, const std::string& this_hostname,
            const std::function<bool(int, std::uint64_t)>& host_alive) {
  if (r.state != "running") return;
  if (!r.hostname.empty() && r.hostname != this_hostname) {
    r.state = "unknown";
    r.problem = "run " + r.id + " runs on host " + r.hostname + ", not on this one";
    return;
  }
  if (r.host_pid <= 0 || !host_alive(r.host_pid, r.host_start_ticks)) {
    r.state = "lost";
    r.problem = "its host (pid " + std::to_string(r.host_pid) + ") is gone without recording how the run ended";
  }
}

namespace {

bool ended_slurm_state(const std::string& state) {
  static const char* const kEnded[] = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
                                       "DEADLINE", "OUT_OF_MEMORY", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"};
  for (const char* e : kEnded)
    if (state.rfind(e, 0) == 0) return true;
  return false;  // PENDING, RUNNING, COMPLETING, REQUEUED, REQUEUE_HOLD, SUSPENDED, ...
}

// squeue -j for these jobs, every state; nullopt when it cannot tell.
std::optional<std::vector<std::pair<std::string, bool>>> ask_squeue(const std::vector<std::string>& ids) {
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ",") + id;
  std::string out;
  const int rc = run_capture("squeue -h -t all -j " + shell_quote(list) + " -o '%i %T' 2>&1", out);
  if (rc != 0) {
    // Asked for one job, squeue fails for a job it no longer knows (for several, it leaves
    // them out): that job has ended. Any other failure (no Slurm, no controller): cannot tell.
    if (ids.size() == 1 && out.find("Invalid job id") != std::string::npos) return {{{ids[0], false}}};
    return std::nullopt;
  }
  return parse_squeue_states(ids, out);
}

}  // namespace

std::vector<std::pair<std::string, bool>> parse_squeue_states(const std::vector<std::string>& asked,
                                                              const std::string& squeue_output) {
  std::vector<std::pair<std::string, bool>> states;
  for (const auto& id : asked) states.emplace_back(id, false);
  std::istringstream lines(squeue_output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string id, state;
    if (!(words >> id >> state)) continue;
    for (auto& [asked_id, active] : states)
      // A job's steps and an array's tasks say ID.STEP or ID_TASK: they are the job's too.
      if (id == asked_id || id.rfind(asked_id + "_", 0) == 0 || id.rfind(asked_id + ".", 0) == 0)
        active = active || !ended_slurm_state(state);
  }
  return states;
}

SlurmJobs::SlurmJobs(std::string cache_file, double max_age) : cache_file_(std::move(cache_file)), max_age_(max_age) {
  load();
}

// The cache file: one line per job, `ID active|ended|unknown TIME`, rewritten whole (atomic).
void SlurmJobs::load() {
  if (cache_file_.empty() || max_age_ <= 0) return;
  std::ifstream in(cache_file_);
  const double now = now_seconds();
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string id, what;
    double at = 0;
    if (!(words >> id >> what >> at) || now - at >= max_age_ || at > now + 1) continue;
    Answer a;
    a.at = at;
    if (what == "active") a.active = true;
    else if (what == "ended") a.active = false;
    known_.emplace_back(id, a);
  }
}

void SlurmJobs::save() const {
  if (cache_file_.empty() || max_age_ <= 0) return;
  std::string text;
  const double now = now_seconds();
  for (const auto& [id, a] : known_) {
    if (now - a.at >= max_age_) continue;
    char at[32];
    std::snprintf(at, sizeof at, "%.3f", a.at);
    text += id + " " + (a.active ? (*a.active ? "active" : "ended") : "unknown") + " " + at + "\n";
  }
  try {
    write_file_atomic(cache_file_, text);
  } catch (const std::exception&) {
    // A runs root this user cannot write to: the answers are not shared, nothing else changes.
  }
}

void SlurmJobs::ask(const std::vector<std::string>& ids) {
  const double now = now_seconds();
  std::vector<std::string> wanted;
  for (const auto& id : ids) {
    if (id.empty() || std::find(wanted.begin(), wanted.end(), id) != wanted.end()) continue;
    const auto it = std::find_if(known_.begin(), known_.end(), [&](const auto& k) { return k.first == id; });
    if (it == known_.end() || now - it->second.at >= max_age_) wanted.push_back(id);
  }
  if (wanted.empty()) return;
  ++calls_;
  const auto states = ask_squeue(wanted);
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    Answer a;
    a.at = now;
    if (states) a.active = (*states)[i].second;
    const auto it = std::find_if(known_.begin(), known_.end(), [&](const auto& k) { return k.first == wanted[i]; });
    if (it != known_.end()) it->second = a;
    else known_.emplace_back(wanted[i], a);
  }
  save();
}

std::optional<bool> SlurmJobs::active(const std::string& id) {
  ask({id});
  const auto it = std::find_if(known_.begin(), known_.end(), [&](const auto& k) { return k.first == id; });
  return it == known_.end() ? std::nullopt : it->second.active;
}

SlurmJobs& shared_slurm_jobs() {
  static SlurmJobs jobs(airhost::default_runs_root() + "/.slurm-jobs");
  return jobs;
}

std::optional<bool> slurm_job_active(const std::string& job_id) {
  SlurmJobs now("", 0);
  return now.active(job_id);
}

namespace {

// Whether settling `r` needs what Slurm says of its job.
bool needs_slurm(const RunRecord& r) {
  if (r.scheduler_job_id.empty() ||
      (r.state != "pending" && r.state != "requeued" && r.state != "unknown" && r.state != "running"))
    return false;
  return !(r.state == "unknown" && r.hostname.empty());  // a run.json that does not parse
}

void settle_here(RunRecord& r) {
  char hostname[256] = "";
  ::gethostname(hostname, sizeof hostname - 1);
  settle(r, hostname, [](int pid, std::uint64_t ticks) {
    ProcStat st;
    // The same pid with another start time is another process: the host is gone.
    return read_proc_stat(pid, st) && st.state != 'Z' && st.state != 'X' && (ticks == 0 || st.start == ticks);
  });
}

void settle_by_slurm(RunRecord& r, SlurmJobs& slurm);

}  // namespace

void settle(RunRecord& r) { settle(r, shared_slurm_jobs()); }

void settle(RunRecord& r, SlurmJobs& slurm) {
  settle_here(r);
  settle_by_slurm(r, slurm);
}

namespace {

void settle_by_slurm(RunRecord& r, SlurmJobs& slurm) {
  // A Slurm job's run, pending or running on another node: Slurm knows whether it still is.
  if (!needs_slurm(r)) return;
  const auto active = slurm.active(r.scheduler_job_id);
  if (!active) return;
  if (!*active && r.state == "requeued") {
    // Slurm may show a job it is requeueing as ended for a moment; a requeue recorded in the
    // last minute is taken at its word. Past that, a job Slurm says has ended is over: its
    // requeued start failed (a reader waiting on the run must not wait for ever).
    struct stat st{};
    if (::stat((r.dir + "/run.json").c_str(), &st) == 0 && now_seconds() - static_cast<double>(st.st_mtime) < 60) return;
  }
  if (*active) {
    if (r.state == "unknown") {
      r.state = "running";  // on another node of the job, as Slurm says
      r.problem.clear();
    }
    return;
  }
  // Slurm is done with the job. Its host may have recorded the end a moment ago.
  RunRecord again = read_run_record(r.dir);
  if (is_ended(again.state)) {
    r = std::move(again);
    return;
  }
  const bool never_started = r.state == "pending" || r.state == "requeued";
  r.state = "lost";
  const std::string output = r.dir + "/slurm-" + r.scheduler_job_id + ".out";
  struct stat st{};
  if (never_started && ::stat(output.c_str(), &st) != 0)
    // Nothing of the job reached the run directory: its nodes could not see it, or it failed
    // before its batch script ran.
    r.problem = "Slurm job " + r.scheduler_job_id + " has ended, and no airhost of it started here: no " + output +
                " either. Is the runs root on a file system the compute nodes see (AIRHOST_RUNS_DIR)? sacct -j " +
                r.scheduler_job_id + " says how the job ended";
  else
    r.problem = "Slurm job " + r.scheduler_job_id + " has ended without airhost recording how the run ended (see " +
                output + ")";
}

}  // namespace

bool looks_like_run_id(const std::string& name) {
  // make_run_id(): YYYYMMDD-HHMMSS-xxxxxx
  if (name.size() != 22 || name[8] != '-' || name[15] != '-') return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (i == 8 || i == 15) continue;
    const char c = name[i];
    if (i < 15 ? !(c >= '0' && c <= '9') : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::vector<RunRecord> list_runs(const std::string& root, bool ask_slurm) {
  std::vector<RunRecord> runs;
  DIR* d = ::opendir(root.c_str());
  if (!d) return runs;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    const std::string dir = root + "/" + name;
    struct stat st{};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    // A folder that is not a run (a backup, a user's own) is no run: one without run.json is a
    // run only when airhost named it (a submit makes it a moment before run.json).
    if (!looks_like_run_id(name) && ::access((dir + "/run.json").c_str(), F_OK) != 0) continue;
    RunRecord r = read_run_record(dir);
    settle_here(r);
    runs.push_back(std::move(r));
  }
  ::closedir(d);
  if (ask_slurm) {
    SlurmJobs& slurm = shared_slurm_jobs();
    std::vector<std::string> jobs;
    for (const auto& r : runs)
      if (needs_slurm(r)) jobs.push_back(r.scheduler_job_id);
    slurm.ask(jobs);  // one squeue call for them all
    for (auto& r : runs) settle_by_slurm(r, slurm);
  }
  // Run ids begin with their start time, so they sort as the runs started; the recorded start
  // decides between runs that have one (ids made on hosts with other time zones).
  std::sort(runs.begin(), runs.end(), [](const RunRecord& a, const RunRecord& b) {
    if (a.started_at > 0 && b.started_at > 0 && a.started_at != b.started_at) return a.started_at > b.started_at;
    return a.id > b.id;
  });
  return runs;
}

const RunRecord& resolve_run(const std::vector<RunRecord>& runs, const std::string& wanted, const std::string& root) {
  if (runs.empty())
    throw ConfigError("no runs in " + root + " yet (AIRHOST_RUNS_DIR chooses where runs are kept)");
  if (wanted == "latest") return runs.front();
  if (wanted.empty()) throw ConfigError("the run id is empty; give one that airhost runs lists, or latest");
  std::vector<const RunRecord*> matches;
  for (const auto& r : runs) {
    if (r.id == wanted) return r;
    if (r.id.rfind(wanted, 0) == 0) matches.push_back(&r);
  }
  if (matches.size() == 1) return *matches.front();
  if (matches.empty())
    throw ConfigError("no run '" + wanted + "' in " + root + "; airhost runs lists the runs there");
  std::string some;
  for (std::size_t i = 0; i < matches.size() && i < 3; ++i) some += (i ? ", " : "") + matches[i]->id;
  throw ConfigError("run id '" + wanted + "' is ambiguous: " + std::to_string(matches.size()) + " runs start with it (" +
                    some + (matches.size() > 3 ? ", ..." : "") + "); give more of it");
}

std::string duration_text(double seconds) {
  if (seconds < 0) return "-";
  char buf[32];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  } else if (seconds < 3600) {
    const long s = std::lround(seconds);
    std::snprintf(buf, sizeof buf, "%ldm %02lds", s / 60, s % 60);
  } else {
    const long m = std::lround(seconds / 60);
    std::snprintf(buf, sizeof buf, "%ldh %02ldm", m / 60, m % 60);
  }
  return buf;
}

std::string runs_table(const std::vector<RunRecord>& runs, double now, std::size_t columns) {
  constexpr int kCols = 9;  // the entry last: the one cell cut to fit the terminal
  struct Row {
    std::string cells[kCols];
  };
  std::vector<Row> rows;
  rows.push_back({{"ID", "STATE", "NODES×RANKS", "STARTED", "DURATION", "EXIT", "SIZE", "JOB", "ENTRY"}});
  bool any_kept = false;
  for (const auto& r : runs) {
    std::string entry = r.entry;
    for (const auto& a : r.args) entry += " " + a;
    const std::string shape = r.nprocs > 0 ? std::to_string(r.nnodes) + "×" + std::to_string(r.nprocs) : "-";
    any_kept = any_kept || r.kept;
    rows.push_back({{r.id + (r.kept ? "*" : ""), r.state, shape, local_time(r.started_at),
                     duration_text(duration_of(r, now)), r.exit_code ? std::to_string(*r.exit_code) : "-",
                     r.bytes ? bytes_text(static_cast<double>(*r.bytes)) : "-",
                     r.scheduler_job_id.empty() ? "-" : r.scheduler_job_id, entry.empty() ? "-" : entry}});
  }
  // Widths in characters, not bytes: × is two bytes of UTF-8 and one column.
  auto width = [](const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::size_t widths[kCols] = {};
  for (const auto& row : rows)
    for (int c = 0; c < kCols - 1; ++c) widths[c] = std::max(widths[c], width(row.cells[c]));
  std::size_t before_entry = 0;
  for (int c = 0; c < kCols - 1; ++c) before_entry += widths[c] + 2;
  std::string out;
  for (auto& row : rows) {
    std::string line;
    for (int c = 0; c < kCols - 1; ++c) line += row.cells[c] + std::string(widths[c] - width(row.cells[c]) + 2, ' ');
    std::string& entry = row.cells[kCols - 1];
    if (columns > 0) {
      // What is left of the line for the entry, at least a few characters of it.
      const std::size_t room = columns > before_entry + 8 ? columns - before_entry : 8;
      if (width(entry) > room) {
        std::size_t keep = 0, chars = 0;  // whole UTF-8 characters, room - 3 of them
        while (keep < entry.size() && chars < room - 3) {
          ++keep;
          while (keep < entry.size() && (static_cast<unsigned char>(entry[keep]) & 0xC0) == 0x80) ++keep;
          ++chars;
        }
        entry = entry.substr(0, keep) + "...";
      }
    }
    line += entry;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (columns > 3 && width(line) > columns) {  // a terminal too narrow for the other columns too
      std::size_t keep = 0, chars = 0;
      while (keep < line.size() && chars < columns - 3) {
        ++keep;
        while (keep < line.size() && (static_cast<unsigned char>(line[keep]) & 0xC0) == 0x80) ++keep;
        ++chars;
      }
      line = line.substr(0, keep) + "...";
    }
    out += line + "\n";
  }
  if (any_kept) out += "* kept: never pruned\n";
  return out;
}

std::string run_json_object(const RunRecord& r, double now) {
  std::ostringstream o;
  const double d = duration_of(r, now);
  o << "{\"run_id\": " << json_quoted(r.id) << ", \"state\": " << json_quoted(r.state) << ", \"nnodes\": " << r.nnodes
    << ", \"nprocs\": " << r.nprocs << ", \"started_at\": " << (r.started_at > 0 ? number(r.started_at) : "null")
    << ", \"ended_at\": " << (r.ended_at > 0 ? number(r.ended_at) : "null")
    << ", \"duration_seconds\": " << (d >= 0 ? number(d) : "null")
    << ", \"exit_code\": " << (r.exit_code ? std::to_string(*r.exit_code) : "null") << ", \"entry\": " << json_quoted(r.entry)
    << ", \"args\": [";
  for (std::size_t k = 0; k < r.args.size(); ++k) o << (k ? ", " : "") << json_quoted(r.args[k]);
  o << "], \"scheduler_job_id\": " << (r.scheduler_job_id.empty() ? "null" : json_quoted(r.scheduler_job_id))
    << ", \"host_pid\": " << r.host_pid << ", \"hostname\": " << json_quoted(r.hostname) << ", \"run_dir\": " << json_quoted(r.dir)
    << ", \"message\": " << json_quoted(r.message) << ", \"problem\": " << json_quoted(r.problem) << ", \"restarts\": " << r.restarts
    << ", \"hang\": " << (r.hang.empty() ? "null" : json_quoted(r.hang)) << ", \"stacks\": " << (r.stacks.empty() ? "null" : json_quoted(r.stacks))
    << ", \"bytes\": " << (r.bytes ? std::to_string(*r.bytes) : "null") << ", \"kept\": " << (r.kept ? "true" : "false")
    << "}";
  return o.str();
}

std::string runs_json(const std::vector<RunRecord>& runs, double now) {
  std::string o = "[";
  for (std::size_t i = 0; i < runs.size(); ++i) o += (i ? ",\n  " : "\n  ") + run_json_object(runs[i], now);
  o += runs.empty() ? "]\n" : "\n]\n";
  return o;
}

std::vector<std::string> node_dirs(const std::string& run_dir, int nnodes) {
  std::vector<std::string> dirs = {run_dir};
  for (int k = 1; k < nnodes; ++k) {
    const std::string dir = run_dir + "/node-" + std::to_string(k);
    struct stat st{};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace airhost::detail
