// slurm_target.hpp — `airhost submit --to slurm`: the batch script (one airhost per node under
// srun, each taking its place in the job from Slurm's environment, as deploy/slurm/train.sbatch
// does by hand) and its submission with sbatch. Never a scheduler of our own: Slurm queues,
// starts, signals and cancels; airhost runs the ranks of each node as always.
#pragma once

#include <string>
#include <vector>

#include "cli/config.hpp"

namespace airhost::detail {

struct BatchJob {
  std::string run_id;
  std::string runs_root;               // AIRHOST_RUNS_DIR for every node: the run lands at <root>/<id>
  std::string run_dir;                 // <root>/<id>: the batch output, the script, node 0's run
  std::string working_dir;             // where the launch was typed: its relative paths hold there
  std::string airhost;                 // this airhost's path (the nodes must see the same one)
  std::vector<std::string> launch;     // what a launch takes, as typed after `airhost submit`
  int nodes = 1;
  SlurmSettings slurm;
  std::string join_token_file;         // several nodes: the job's secret (mode 0600, in run_dir), handed
                                       // to every node's airhost as --join-token-file; empty: none
};

// The script, with every value shell-quoted; pure (doctested).
std::string render_batch_script(const BatchJob& job);

// Submits `script_path` with `sbatch --parsable`; returns the job id. Throws ConfigError
// passing sbatch's own refusal on (a partition that does not exist, say) in one line.
std::string sbatch_submit(const std::string& script_path);

// run.json of a job Slurm has queued but not started: state "pending", its job id. Replaced
// by node 0's host when the job starts.
std::string pending_run_json(const BatchJob& job, const std::string& job_id, double submitted_at);

}  // namespace airhost::detail
