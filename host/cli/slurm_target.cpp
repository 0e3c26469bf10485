// slurm_target.cpp — the batch script and sbatch (see slurm_target.hpp).
#include "cli/slurm_target.hpp"

#include <sys/wait.h>

#include <cstdio>
#include <sstream>

#include "base/errors.hpp"
#include "base/util.hpp"
#include "cli/commands.hpp"

namespace airhost::detail {

namespace {

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}
}  // namespace

std::string render_batch_script(const BatchJob& job) {
  const SlurmSettings& s = job.slurm;
  std::ostringstream o;
  o << "#!/bin/bash\n"
    << "# Written by `airhost submit --to slurm` for run " << job.run_id << ": Slurm runs ONE airhost\n"
    << "# per node (srun --ntasks-per-node=1), and each takes its place in the job (nodes, node\n"
    << "# rank, master address and port) from Slurm's environment (docs/multinode.md).\n"
    << "#SBATCH --job-name=airhost-" << job.run_id << "\n"
    << "#SBATCH --nodes=" << job.nodes << "\n"
    << "#SBATCH --ntasks-per-node=1\n"
    << "#SBATCH --output=" << job.run_dir << "/slurm-%j.out\n"
    << "#SBATCH --open-mode=append\n";
  // The warning before the time limit (docs/jobs.md, "Preemption and time limits"): Slurm
  // signals every step's tasks, the airhosts, which pass it to every rank.
  const std::string warning = s.signal.value_or("USR1@90");
  if (!warning.empty()) o << "#SBATCH --signal=" << warning << "\n";
  if (s.requeue.value_or(false)) o << "#SBATCH --requeue\n";
  if (s.partition) o << "#SBATCH --partition=" << *s.partition << "\n";
  if (s.account) o << "#SBATCH --account=" << *s.account << "\n";
  if (s.qos) o << "#SBATCH --qos=" << *s.qos << "\n";
  if (s.time) o << "#SBATCH --time=" << *s.time << "\n";
  if (s.gpus_per_node) o << "#SBATCH --gpus-per-node=" << *s.gpus_per_node << "\n";
  if (s.cpus_per_task) o << "#SBATCH --cpus-per-task=" << *s.cpus_per_task << "\n";
  if (s.mem) o << "#SBATCH --mem=" << *s.mem << "\n";
  if (s.constraint) o << "#SBATCH --constraint=" << *s.constraint << "\n";
  for (const auto& line : s.extra) o << "#SBATCH " << line << "\n";
  o << "set -euo pipefail\n"
    << "cd " << shell_quote(job.working_dir) << "\n"
    << "export AIRHOST_RUNS_DIR=" << shell_quote(job.runs_root) << "\n"
    << "export " << kSubmitRunIdVar << "=" << shell_quote(job.run_id) << "\n";
  if (s.requeue.value_or(false)) o << "export AIRHOST_REQUEUE=1  # node 0 requeues the job when it stops after the warning\n";
  // --kill-on-bad-exit=1: a node whose airhost fails ends the others at once rather than
  // leaving them in a collective. --cpus-per-task again: Slurm 22.05 to 23.02 do not let a
  // step inherit it.
  o << "srun --ntasks-per-node=1 --kill-on-bad-exit=1"
    << (s.cpus_per_task ? " --cpus-per-task=\"$SLURM_CPUS_PER_TASK\"" : "") << " \\\n  " << shell_quote(job.airhost);
  // The job's secret, made by submit (docs/multinode.md, "The join token"): node 0 admits only
  // this job's nodes. Given before the script's arguments, and only if the launch names none.
  bool token_given = job.join_token_file.empty();
  for (const auto& a : job.launch) {
    if (a == "--" && !token_given) {
      o << " '--join-token-file' " << shell_quote(job.join_token_file);
      token_given = true;
    }
    if (a == "--join-token-file" || a.rfind("--join-token-file=", 0) == 0) token_given = true;
    o << " " << shell_quote(a);
  }
  if (!token_given) o << " '--join-token-file' " << shell_quote(job.join_token_file);
  o << "\n";
  return o.str();
}

std::string sbatch_submit(const std::string& script_path) {
  std::string out;
  const int status = run_capture("sbatch --parsable " + shell_quote(script_path) + " 2>&1", out);
  out = trim(out);
  if (status != 0) {
    // sbatch's refusal says what is wrong ("invalid partition specified"): passed on, one line.
    std::string said = out;
    for (auto& c : said)
      if (c == '\n') c = ' ';
    // sbatch is there but no Slurm to speak to (no configuration, no controller): no setting
    // of the job's would fix it.
    static const char* const kUnreachable[] = {
        "Could not establish a configuration source", "Unable to process configuration file",
        "Unable to contact slurm controller", "Zero Bytes were transmitted or received",
        "Socket timed out", "Connection refused", "Communication connection failure"};
    for (const char* sign : kUnreachable)
      if (out.find(sign) != std::string::npos) {
        std::string fatal = said;
        if (const auto at = out.find("fatal: "); at != std::string::npos)
          fatal = trim(out.substr(at + 7, out.find('\n', at) == std::string::npos ? std::string::npos : out.find('\n', at) - at - 7));
        throw ConfigError("Slurm is not reachable from this machine: sbatch is installed, but says \"" + fatal + "\"" +
                          "; nothing was submitted (check that slurmctld runs and that SLURM_CONF or /etc/slurm "
                          "names it, or run the job on this machine with --to local)");
      }
    throw ConfigError("sbatch refused the job: " + (said.empty() ? std::string("no message") : said) +
                      "; nothing was submitted (fix the [slurm] setting or flag it names)");
  }
  // --parsable prints "JOBID" or "JOBID;CLUSTER", after any warnings on lines of their own.
  const std::string last = out.substr(out.find_last_of('\n') == std::string::npos ? 0 : out.find_last_of('\n') + 1);
  return last.substr(0, last.find(';'));
}

std::string pending_run_json(const BatchJob& job, const std::string& job_id, double submitted_at) {
  char at[64];
  std::snprintf(at, sizeof at, "%.6f", submitted_at);
  std::ostringstream o;
  o << "{\n  \"run_id\": " << json_quoted(job.run_id) << ",\n  \"run_dir\": " << json_quoted(job.run_dir)
    << ",\n  \"state\": \"pending\",\n  \"outcome\": null,\n  \"exit_code\": null,\n  \"root_cause\": -1"
    << ",\n  \"message\": " << json_quoted("run " + job.run_id + " is queued as Slurm job " + job_id)
    << ",\n  \"submitted_at\": " << at << ",\n  \"started_at\": " << at << ",\n  \"ended_at\": null"
    << ",\n  \"scheduler\": \"slurm\",\n  \"scheduler_job_id\": " << json_quoted(job_id) << ",\n  \"nnodes\": " << job.nodes
    << ",\n  \"nprocs\": 0,\n  \"node_rank\": 0,\n  \"launch\": [";
  for (std::size_t i = 0; i < job.launch.size(); ++i) o << (i ? ", " : "") << json_quoted(job.launch[i]);
  o << "],\n  \"ranks\": []\n}\n";
  return o.str();
}

}  // namespace airhost::detail
