// run_records.hpp — the runs root read back: each run directory's run.json as a RunRecord,
// whether a "running" run still has its host, run ids as the user types them, and the table
// of `airhost runs`. Pure but for reading files and /proc (run_commands.cpp prints).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace airhost::detail {

struct RankRecord {
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  std::string state;           // pending, running, succeeded, failed, stopped
  int exit_code = -1;
  int signal = 0;
  std::string signal_name;
  std::string stdout_log;
  std::string stderr_log;
  bool has_error = false;      // the rank sent an exception:
  std::string error_type;      //   its type,
  std::string error_message;   //   str(exception)
  std::string traceback;       //   and the formatted traceback
};

struct RunRecord {
  std::string id;
  std::string dir;
  // What run.json says (running, succeeded, failed, cancelled, interrupted, timed_out,
  // node_lost, not_started), then, by settle(): lost when its host is gone without writing
  // the end, unknown when it runs on another host or its run.json is unreadable, starting when
  // there is no run.json yet (a submit a moment ago).
  std::string state;
  std::optional<int> exit_code;
  int root_cause = -1;
  std::string message;
  std::string hang;     // the hang watch's report, when it found one (run.json "hang")
  std::string stacks;   // the newest stacks file in its stacks/ folder, "" when none
  double started_at = 0;       // seconds since the epoch; 0 = not recorded
  double ended_at = 0;         // 0 = not ended (or not recorded)
  double wall_seconds = 0;
  int restarts = 0;
  struct Attempt {
    int attempt = 0, nnodes = 1, node_rank = 0;
    std::vector<std::string> nodes;
    std::string began;
  };
  std::vector<Attempt> attempts;  // run.json "attempts": each attempt's group and why it began
  int host_pid = 0;
  std::uint64_t host_start_ticks = 0;
  std::string hostname;
  bool host_handles_signals = false;
  std::string scheduler_job_id;
  std::string entry;           // as typed: train.py, train.py:main, -m pkg, train() (Python API)
  // Filled by the commands that show them (not by list_runs, which every read-back uses):
  std::optional<std::uint64_t> bytes;  // what its directory takes on disk
  bool kept = false;                   // `airhost runs keep`: never pruned
  std::vector<std::string> args;
  int nprocs = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::vector<RankRecord> ranks;
  std::string problem;         // why the record could not be read, when it could not
};

// run.json's text → a record; a text that is not JSON gives state "unknown" and `problem`.
RunRecord parse_run_record(const std::string& dir, const std::string& json_text);

// Reads `dir`/run.json (a directory without one: state "starting" for a minute, then
// "unknown"). Never throws.
RunRecord read_run_record(const std::string& dir);

// A "running" record whose host is gone is "lost"; one on another host is "unknown" (nothing
// here can tell). `host_alive(pid, start_ticks)`: the process is there and is that one.
void settle(RunRecord& r, const std::string& this_hostname,
            const std::function<bool(int pid, std::uint64_t start_ticks)>& host_alive);
class SlurmJobs;
// The same, with this node's hostname and /proc, then, for a Slurm job's run, what Slurm says
// (`slurm`: shared_slurm_jobs() unless given).
void settle(RunRecord& r);
void settle(RunRecord& r, SlurmJobs& slurm);

bool is_ended(const std::string& state);

// What Slurm says of the jobs of runs, asked with one squeue call for many: a runs root holds
// many runs of Slurm jobs, and a read-back of one (runs show, logs, cancel, stacks) must not ask
// once per run, one after another. An answer younger than `max_age` seconds is reused, in this
// process and, through `cache_file` (in the runs root; "" for none), by the other airhost
// commands of its user: a caller that polls a job (Job.state every 0.5 s, `logs --follow`)
// costs one squeue every `max_age` seconds at most, however many runs the root holds.
class SlurmJobs {
 public:
  explicit SlurmJobs(std::string cache_file = "", double max_age = 2.0);
  // One squeue call for every job of `ids` without a fresh answer (none when all have one).
  void ask(const std::vector<std::string>& ids);
  // Whether Slurm still has the job in hand (pending, running, completing, being requeued,
  // suspended...); false once it ended or Slurm no longer knows it; nullopt when squeue cannot
  // tell (no Slurm here, no controller). Asks for it alone when no fresh answer is known.
  std::optional<bool> active(const std::string& id);
  int squeue_calls() const { return calls_; }

 private:
  struct Answer {
    std::optional<bool> active;
    double at = 0;
  };
  void load();
  void save() const;
  std::string cache_file_;
  double max_age_;
  std::vector<std::pair<std::string, Answer>> known_;
  int calls_ = 0;
};

// The jobs of the default runs root (its cache in AIRHOST_RUNS_DIR/.slurm-jobs), shared by
// every read-back of this process.
SlurmJobs& shared_slurm_jobs();

// squeue's lines `ID STATE` (asked with -o "%i %T") → whether each asked job is active; the
// jobs that it does not list are no longer known to Slurm (ended). Pure; doctested.
std::vector<std::pair<std::string, bool>> parse_squeue_states(const std::vector<std::string>& asked,
                                                              const std::string& squeue_output);

// Whether Slurm still has job `job_id` in hand, asked now (no cache: `airhost cancel` waits
// for the job to go). squeue is asked for every state (-t all): a job in the middle of a
// requeue is not in its default list.
std::optional<bool> slurm_job_active(const std::string& job_id);  // succeeded, failed, cancelled, ...: not running, starting, lost, unknown

// Whether `name` has the shape of a run id airhost makes (YYYYMMDD-HHMMSS-xxxxxx).
bool looks_like_run_id(const std::string& name);

// Every run directory under `root`, read and settled, newest first. A root that does not
// exist holds no runs. `ask_slurm`: settle the runs of Slurm jobs by what Slurm says (one
// squeue call for them all); without it, they are as their run.json says: a read-back of one
// run lists without, then settles that one (find_run).
std::vector<RunRecord> list_runs(const std::string& root, bool ask_slurm = true);

// The run that `wanted` names among `runs` (newest first): `latest`, a full id or a unique
// prefix of one. Throws ConfigError, one sentence, for an unknown or ambiguous id.
const RunRecord& resolve_run(const std::vector<RunRecord>& runs, const std::string& wanted, const std::string& root);

// "1m 05s", "3.2 s", "2h 04m".
std::string duration_text(double seconds);
// The `airhost runs` table, one line per run; `now` for the duration of running ones. No line
// is wider than `columns` (0: no limit): the entry, last, is cut to fit. A kept run's id is
// marked "*", and a line under the table says so.
std::string runs_table(const std::vector<RunRecord>& runs, double now, std::size_t columns = 0);
// The same runs as a JSON array (`airhost runs --json`), each as run_json_object gives it.
std::string runs_json(const std::vector<RunRecord>& runs, double now);
std::string run_json_object(const RunRecord& r, double now);

// The directories of a run's nodes: `run_dir` itself (node 0, or a run of one node), then the
// `node-K/` that a submitted several-node job keeps inside it, those that exist.
std::vector<std::string> node_dirs(const std::string& run_dir, int nnodes);

}  // namespace airhost::detail
