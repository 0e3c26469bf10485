// airhost — run a Python script or function on every accelerator of this node.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "launch/link/link_auth.hpp"
#include "airhost/airhost.hpp"
#include "base/util.hpp"
#include "cli/cluster_env.hpp"
#include "cli/command_line.hpp"
#include "cli/commands.hpp"
#include "cli/retention.hpp"
#include "cli/tracking.hpp"
#include "gpu/accelerators.hpp"
#include "launch/run/run_dir.hpp"
#include "launch/run/run_report.hpp"
#include "launch/rank/warm_starter.hpp"

using namespace airhost;
using namespace airhost::detail;

namespace {

// SIGINT, SIGTERM and SIGHUP outside a run (while the command line is read, a preflight
// runs, the run is written down): nothing of a run is alive to forward them to, so the host
// ends as the signal would end it. It must be a handler, not SIG_DFL: as a container's PID 1
// the kernel drops a signal whose action is the default, and `docker stop` would wait for its
// SIGKILL. During a run the supervisor watches them instead, and puts this one back after.
void on_signal_outside_a_run(int sig) {
  if (::getpid() == 1) _exit(128 + sig);  // the contract's 128+signal (129 / 130 / 143)
  ::signal(sig, SIG_DFL);  // elsewhere: die of it, exactly as without a handler
  ::raise(sig);
}

// A scheduler's warning (SIGUSR1, SIGUSR2) with no rank to pass it to must not end the host,
// as their default action would; during a run the supervisor passes it on.
void on_warning_outside_a_run(int) {}

void handle_signals_outside_a_run() {
  struct sigaction sa{};
  sa.sa_handler = on_signal_outside_a_run;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_warning_outside_a_run;
  for (int sig : {SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);
}

// Whether this node's run, if the scheduler's warning stops it, is to be requeued: a job
// submitted with --requeue (AIRHOST_REQUEUE=1 in its batch script), node 0 (which asks Slurm).
// Its final run.json then says "requeued" from the start (LaunchSpec::requeue_when_preempted):
// a reader never sees it ended (Job.wait() returning, `submit --watch` exiting, a prune taking
// its payload and join token) while the MLflow run is closed and Slurm asked.
bool requeue_expected(int node_rank) {
  return node_rank == 0 && !getenv_or("SLURM_JOB_ID", "").empty() && getenv_or("AIRHOST_REQUEUE", "") == "1";
}

// A run that stopped after the scheduler's warning of a job submitted with --requeue: node 0
// asks Slurm to requeue the job, which then runs again with the same run id and directory, and
// resumes. If Slurm refuses, node 0's run.json goes back from "requeued" to "preempted".
//
// Every node of such a job that stopped after the warning exits 0 (returns true): the job goes
// on in its requeue, and a non-zero exit would make srun (--kill-on-bad-exit) end the other
// nodes' hosts before node 0 has requeued it and the MLflow run is closed.
bool requeue_if_preempted(const RunReport& report, int node_rank) {
  const std::string job = getenv_or("SLURM_JOB_ID", "");
  if (!report.warning_signal || report.ok() || job.empty() || getenv_or("AIRHOST_REQUEUE", "") != "1") return false;
  const std::string path = report.run_dir + "/run.json";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string was = node_rank == 0 ? "\"state\": \"requeued\"" : "\"state\": \"preempted\"";
  const auto at = text.find(was);
  if (at == std::string::npos) return false;  // cancelled meanwhile: not to be requeued
  if (node_rank != 0) return true;
  // Said before asking: the requeue ends this job's steps, this host among them, at once.
  std::fprintf(stderr, "airhost: run %s stopped for the job's time; requeueing Slurm job %s, which resumes it\n",
               report.run_id.c_str(), job.c_str());
  std::fflush(stderr);
  std::string said;
  if (run_capture("scontrol requeue " + shell_quote(job) + " 2>&1", said) != 0) {
    text.replace(at, was.size(), "\"state\": \"preempted\"");
    try {
      write_file_atomic(path, text);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "airhost: %s\n", e.what());
    }
    while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
    std::fprintf(stderr, "airhost: run %s was preempted, and Slurm refused to requeue job %s: %s\n", report.run_id.c_str(),
                 job.c_str(), said.c_str());
    return false;
  }
  return true;
}

// HostOptions (flags over file over what Slurm or Kubernetes say over defaults: see
// cluster_env.hpp) → a fully resolved LaunchSpec; `cluster` says where each value came from.
LaunchSpec make_spec(const HostOptions& opts, ClusterResolution& cluster) {
  cluster = resolve_cluster(opts.flags, opts.settings, opts.config_path, detect_cluster(current_environment_map()));
  const Settings& s = cluster.settings;
  LaunchSpec spec;
  spec.entry = opts.entry;
  spec.entry.module_target = opts.module_target;
  const auto inventory = detect_accelerators();
  spec.nprocs = s.accelerators.value_or(0) > 0 ? *s.accelerators : default_rank_count(inventory);
  try {
    spec.devices = assign_devices(inventory, spec.nprocs);
  } catch (const ConfigError& e) {
    const std::string& from = cluster.origin.at("accelerators");
    if (from == "flag" || from == "default" || from.rfind("config ", 0) == 0) throw;
    throw ConfigError(std::string(e.what()) + " (the count came from " + from + "; give -n to override it)");
  }
  if (s.timeout) spec.timeout = *s.timeout;
  if (s.grace) spec.grace = *s.grace;
  if (s.hang_timeout) spec.hang_timeout = *s.hang_timeout;
  if (s.stop_on_hang) spec.stop_on_hang = *s.stop_on_hang;
  if (s.python) spec.python = *s.python;
  if (s.run_dir) spec.run_dir = *s.run_dir;
  if (s.master_addr) spec.master_addr = *s.master_addr;
  if (s.master_port) spec.master_port = *s.master_port;
  if (s.nnodes) spec.nnodes = *s.nnodes;
  if (s.nnodes_min) spec.nnodes_min = *s.nnodes_min;
  if (s.join_settle) spec.join_settle = *s.join_settle;
  if (s.scale_up_interval) spec.scale_up_interval = *s.scale_up_interval;
  if (s.node_rank) spec.node_rank = *s.node_rank;
  // An elastic job's nodes but node 0 may leave their rank to node 0.
  else if (spec.nnodes_min > 0) spec.node_rank = -1;
  if (s.max_restarts) spec.max_restarts = *s.max_restarts;
  // A requeued Slurm job counts on: its ranks see TORCHELASTIC_RESTART_COUNT go up.
  if (const auto count = getenv_or("SLURM_RESTART_COUNT", ""); !count.empty() && !getenv_or("SLURM_JOB_ID", "").empty())
    spec.restart_offset = std::max(0, std::atoi(count.c_str()));
  if (s.node_timeout) spec.node_timeout = *s.node_timeout;
  if (s.join_timeout) spec.join_timeout = *s.join_timeout;
  if (s.join_token_file) {
    try {
      spec.join_token = read_join_token_file(*s.join_token_file);
    } catch (const JoinAuthError& e) {
      throw ConfigError(e.what());
    }
  }
  if (s.prefix) spec.output.prefix = *s.prefix;
  if (s.log_max_bytes) spec.output.log_max_bytes = *s.log_max_bytes;
  if (s.ranks) spec.output.ranks = *s.ranks;
  // The terminal the ranks' output is shown on (stderr first: tqdm's default), else the
  // width the caller's COLUMNS gives: the ranks get it, less the prefix (rank_env.hpp).
  std::tie(spec.output.terminal_columns, spec.output.terminal_lines) = terminal_size(STDERR_FILENO);
  if (!spec.output.terminal_columns)
    std::tie(spec.output.terminal_columns, spec.output.terminal_lines) = terminal_size(STDOUT_FILENO);
  if (!spec.output.terminal_columns)
    spec.output.terminal_columns = std::atoi(getenv_or("COLUMNS", "0").c_str());
  spec.env = s.env;
  // A running warm server of this user forks the ranks when it matches (AIRHOST_WARM=0 or
  // --cold: never); the launcher falls back to a cold start otherwise.
  if (s.warm.value_or(getenv_or("AIRHOST_WARM", "1") != "0")) spec.warm_socket = default_warm_socket();
  spec.warm_preload = s.preload.value_or("");
  spec.handle_signals = true;
  spec.keep_result_descriptors = true;  // save_results streams them to results/ from shared memory
  spec.reap_orphans = true;  // a child subreaper, as tini -s: nothing a rank starts escapes
  return spec;
}

// Function entries return values; the CLI keeps them as files next to run.json, each a
// plain pickle (or JSON text) that pickle.load reads, whichever way it came from the rank.
// A rank's exception, when it could be pickled, goes beside them as rank-N.exception.pkl: a
// job's caller (the Python API's Job.result()) raises from it, as .distributed() does.
void save_results(const RunReport& report) {
  bool any = false;
  for (const auto& r : report.ranks)
    any |= r.result.has_value() || r.result_blob != nullptr || (r.error && !r.error->pickled.empty());
  if (!any) return;
  std::string dir = report.run_dir + "/results";
  make_dirs(dir);
  for (const auto& r : report.ranks) {
    const std::string path = dir + "/rank-" + std::to_string(r.rank) + ".pkl";
    if (r.result) write_file_atomic(path, *r.result);
    else if (r.result_blob) write_file_atomic(path, [&](int fd) { r.result_blob->write_to(fd); });
    if (r.error && !r.error->pickled.empty())
      write_file_atomic(dir + "/rank-" + std::to_string(r.rank) + ".exception.pkl", r.error->pickled);
  }
}

int run_main(int argc, char** argv);

// A launch started by `airhost submit` (commands.hpp): its run id, and the descriptor on which
// it says "checked, starting". Taken out of the environment at once, so that neither the ranks
// nor an airhost they start take them for their own.
struct Submitted {
  std::string run_id;
  int ready_fd = -1;

  static Submitted from_environment() {
    Submitted s;
    s.run_id = getenv_or(kSubmitRunIdVar, "");
    const std::string fd = getenv_or(kSubmitReadyFdVar, "");
    ::unsetenv(kSubmitRunIdVar);
    ::unsetenv(kSubmitReadyFdVar);
    if (!fd.empty()) {
      s.ready_fd = std::atoi(fd.c_str());
      if (s.ready_fd > 2 && ::fcntl(s.ready_fd, F_SETFD, FD_CLOEXEC) != 0) s.ready_fd = -1;
    }
    return s;
  }
  // The launch passed its checks: the submitter prints the run id and returns.
  void ready() {
    if (ready_fd < 0) return;
    (void)!::write(ready_fd, "R", 1);
    ::close(ready_fd);
    ready_fd = -1;
  }
};

Submitted g_submitted;

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor of a 3-day run
  handle_signals_outside_a_run();
  g_submitted = Submitted::from_environment();
  const int code = run_main(argc, argv);
  // As PID 1 (a container's entrypoint) this process is every orphan's parent: reap what is
  // left before leaving (the kernel ends the namespace's processes when PID 1 exits).
  if (::getpid() == 1)
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  return code;
}

namespace {

int run_main(int argc, char** argv) {
  // The commands about runs that exist (runs, logs, cancel) take run ids, not a launch's
  // flags: they have their own small parser.
  if (argc > 1 && is_run_command(argv[1])) {
    const std::vector<std::string> rest(argv + 2, argv + argc);
    for (const auto& a : rest)
      if (a == "-h" || a == "--help") return std::fputs(usage_text().c_str(), stdout), 0;
    return run_command(argv[1], rest);
  }
  if (argc > 1 && std::string(argv[1]) == "submit") {
    const std::vector<std::string> rest(argv + 2, argv + argc);
    for (const auto& a : rest) {
      if (a == "--") break;
      if (a == "-h" || a == "--help") return std::fputs(usage_text().c_str(), stdout), 0;
    }
    return submit_command(rest);
  }

  HostOptions opts;
  try {
    opts = parse_command_line(std::vector<std::string>(argv, argv + argc), current_directory());
  } catch (const ConfigError& e) {
    return usage_error(e.what());
  }

  switch (opts.command) {
    case Command::help:
      std::fputs(usage_text().c_str(), stdout);
      return 0;
    case Command::version:
      std::printf("airhost %s\n", version());
      return 0;
    case Command::doctor:
      return doctor_command(opts);
    case Command::warm:
      return warm_command(opts);
    case Command::run:
      break;
  }

  LaunchSpec spec;
  ClusterResolution cluster;
  try {
    spec = make_spec(opts, cluster);
  } catch (const ConfigError& e) {
    return usage_error(e.what());
  }
  if (opts.print_env) return print_env(spec, cluster);

  if (spec.python.empty()) spec.python = default_python();
  try {
    Launcher(spec).check();  // refused before a preflight or an MLflow run is spent on it
  } catch (const LaunchError& e) {
    return usage_error(e.what());
  }
  if (opts.settings.preflight.value_or(false)) {
    auto problems = preflight(spec);
    for (const auto& p : problems) std::fprintf(stderr, "airhost: preflight: %s\n", p.c_str());
    if (!problems.empty()) {
      std::fprintf(stderr, "airhost: preflight failed; nothing was started (fix the node, or run without --preflight)\n");
      return to_int(ExitCode::preflight_failed);
    }
    std::fprintf(stderr, "airhost: preflight passed (%zu GPU(s), interpreter imports torch)\n", spec.devices.size());
  }
  g_submitted.ready();
  // A job submitted to Slurm finds the run directory that `airhost submit` made, unless the
  // runs root is not on a file system this node sees: said here (slurm-JOBID.out, if Slurm
  // could write it), and on the submitting node by `airhost runs`.
  if (!g_submitted.run_id.empty() && !getenv_or("SLURM_JOB_ID", "").empty() && !opts.settings.run_dir &&
      !std::filesystem::is_directory(default_runs_root() + "/" + g_submitted.run_id)) {
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    std::fprintf(stderr, "airhost: run %s: its directory %s/%s, made by airhost submit, is not on this node (%s); the runs "
                 "root must be on a file system every node of the job sees: set AIRHOST_RUNS_DIR to one (NFS, Lustre, "
                 "...) and submit again\n", g_submitted.run_id.c_str(), default_runs_root().c_str(),
                 g_submitted.run_id.c_str(), host);
    return to_int(ExitCode::usage);
  }

  // The MLflow run is made beside the ranks' start (tracking.hpp); the ranks learn of it
  // through a file in the run directory, which must therefore be known now.
  if (spec.run_id.empty()) spec.run_id = g_submitted.run_id.empty() ? make_run_id() : g_submitted.run_id;
  if (spec.run_dir.empty()) spec.run_dir = default_runs_root() + "/" + spec.run_id;
  // A job submitted to several Slurm nodes is one run: node 0's directory is the run's, and
  // each other node keeps its own record and logs inside it (airhost logs ID --node K). Node K
  // runs as ID-nodeK: the run id in the ranks' environment is what a host's sweep for escaped
  // processes looks for, and two nodes of a job may share a machine.
  const int job_node = g_submitted.run_id.empty() || opts.settings.run_dir ? 0 : spec.node_rank;
  if (job_node > 0) {
    spec.run_dir = default_runs_root() + "/" + spec.run_id + "/node-" + std::to_string(spec.node_rank);
    spec.run_id += "-node" + std::to_string(spec.node_rank);
  }
  // Flags and files win; AIRHOST_TRACKING=0 turns it off for a whole CI job or test suite.
  const bool track = opts.settings.tracking.value_or(getenv_or("AIRHOST_TRACKING", "1") != "0");
  TrackingRun tracking;
  if (track && job_node > 0) {
    // One MLflow run per job: node 0's host makes it, in the run's directory that every node
    // of a submitted job sees; the ranks here bind it as node 0's do (tracking.hpp).
    spec.env.try_emplace("AIRHOST_MLFLOW_PENDING", default_runs_root() + "/" + g_submitted.run_id + "/tracking.env");
  } else if (track && spec.nnodes > 1 && spec.node_rank > 0) {
    // Several nodes, each with a run directory of its own: node 0's link sends its MLflow run
    // here (LaunchSpec::node_shared_file), where the ranks bind it.
    spec.node_shared_file = "tracking.env";
    spec.env.try_emplace("AIRHOST_MLFLOW_PENDING", spec.run_dir + "/tracking.env");
  } else if (track) {
    if (spec.nnodes > 1) spec.node_shared_file = "tracking.env";
    // The experiment of the run: --experiment or the config's, over MLFLOW_EXPERIMENT_NAME.
    if (opts.settings.experiment) ::setenv("MLFLOW_EXPERIMENT_NAME", opts.settings.experiment->c_str(), 1);
    // A pickled function is named by its payload file (train.pkl: the Python API's job of train).
    const std::string name = spec.entry.kind == Entry::Kind::pickled
                                 ? std::filesystem::path(spec.entry.target).stem().string()
                                 : spec.entry.target;
    // A requeued job (restart_offset > 0) goes on in the MLflow run its first start made.
    std::string resume;
    if (spec.restart_offset > 0) {
      std::ifstream made(spec.run_dir + "/tracking.env");
      for (std::string line; std::getline(made, line);)
        if (line.rfind("MLFLOW_RUN_ID=", 0) == 0) resume = line.substr(14);
    }
    tracking = TrackingRun::start(spec.python, name, spec.nprocs, spec.run_dir + "/tracking.env", resume);
    for (const auto& [k, v] : tracking.rank_env()) spec.env.try_emplace(k, v);
  }

  Callbacks callbacks;
  // Said up front when a warm server is there (used, or refused and why); a launch with no
  // server at all says "cold start" in its last line only, so output starts as it always did.
  callbacks.on_start_mode = [](bool, const std::string& line) {
    if (line.find("no warm server running") == std::string::npos) std::fprintf(stderr, "airhost: %s\n", line.c_str());
  };
  // The results go into the run directory before the final run.json says the run ended: a
  // job's caller that sees it ended (Job.result()) finds them there.
  callbacks.before_final_record = [](const RunReport& r) {
    try {
      save_results(r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "airhost: cannot save results: %s\n", e.what());
    }
  };
  const int node_rank = spec.node_rank;
  spec.requeue_when_preempted = requeue_expected(node_rank);
  const std::string launcher_run_id = spec.run_id;
  Launcher launcher(std::move(spec), std::move(callbacks));
  RunReport report;
  try {
    report = launcher.run();
  } catch (const LaunchError& e) {
    // Refused by what this node gives (a run directory, a port, open files), not by the
    // command line: the sentence says what to do, and --help would not.
    tracking.finish(Outcome::failed);
    std::fprintf(stderr, "airhost: %s\n", e.what());
    return to_int(ExitCode::usage);
  } catch (const std::exception& e) {
    // What the launcher does not turn into a report itself: said in one line, exit 1, never
    // an abort (the ranks are stopped by the launcher's own destructors on the way here).
    tracking.finish(Outcome::failed);
    std::fprintf(stderr, "airhost: run %s ended on an error of this host: %s\n", launcher_run_id.c_str(), e.what());
    return to_int(ExitCode::generic_failure);
  }
  // A run stopped by the scheduler's warning is KILLED in MLflow (and RUNNING again if requeued).
  tracking.finish(report.warning_signal && !report.ok() ? Outcome::interrupted : report.outcome);
  const bool requeued = requeue_if_preempted(report, node_rank);

  if (report.ok()) {
    std::fprintf(stderr, "airhost: %s in %.1f s%s (logs: %s/logs)\n", report.message.c_str(), report.wall_seconds,
                 report.warm ? ", warm start" : "", report.run_dir.c_str());
  } else if (report.warning_signal && report.outcome != Outcome::interrupted) {
    // Preempted, as asked: no failure summary for a loop that checkpointed and stopped.
    std::fprintf(stderr, "airhost: %s (logs: %s/logs)\n", report.message.c_str(), report.run_dir.c_str());
  } else {
    std::fputs(failure_summary(report).c_str(), stderr);
  }
  for (const auto& line : report.trimmed_logs) std::fprintf(stderr, "airhost: %s\n", line.c_str());
  if (!report.incomplete_logs.empty()) {
    std::fprintf(stderr, "airhost: the logs of this run are incomplete: %zu log(s) stopped early (a full disk? a quota?), "
                 "named above and in run.json; the console got every line\n", report.incomplete_logs.size());
  }
  if (report.unshown_bytes) {
    // Said last, once the reader is back: the run did not wait for it (console_writer.hpp).
    std::fprintf(stderr, "airhost: %.1f MiB of the ranks' output was not shown: the reader of this output did not "
                 "keep up (every byte is in the logs: %s/logs)\n", static_cast<double>(report.unshown_bytes) / (1 << 20),
                 report.run_dir.c_str());
  }
  // Run directories do not pile up: the retention policy, now that this run has ended
  // (retention.hpp; never a live run, a kept one, or one under --run-dir).
  if (!opts.settings.run_dir && job_node == 0) {
    try {
      const auto removed = prune_runs(default_runs_root(), launch_retention(opts.settings.retention), false);
      if (!removed.empty()) {
        std::uint64_t freed = 0;
        for (const auto& v : removed) freed += v.bytes;
        std::fprintf(stderr, "airhost: pruned %zu old run(s) of %s, %s freed (%s; airhost runs keep ID spares a run, "
                     "AIRHOST_RETENTION=off keeps them all)\n", removed.size(), default_runs_root().c_str(),
                     bytes_text(static_cast<double>(freed)).c_str(), removed.front().why.c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "airhost: pruning old runs: %s\n", e.what());
    }
  }
  return requeued ? 0 : report.exit_code;  // a requeued job goes on
}


}  // namespace
