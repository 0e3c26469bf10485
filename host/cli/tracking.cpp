#include "cli/tracking.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "base/util.hpp"
#include "cli/usage_metrics_py.hpp"  // generated from runtime/python/airhost/_usage_metrics.py

extern char** environ;

namespace airhost::detail {
namespace {

// Run in the ranks' interpreter with -c, so it needs nothing of airhost there. argv: the env
// file, the run name, the rank count, the seconds to defer the work by. The file appears
// atomically (rename), once: either the run's variables or NONE=<why>. Then one line on stdin
// is the final status; end of file without one means the host died, and the run is KILLED.
constexpr const char* kHelper = R"PY(
import importlib.util, os, select, signal, sys, time
# Slurm's warning before the time limit reaches every process of the step: it is for the ranks.
for _sig in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(_sig, signal.SIG_IGN)
path, name, nprocs, defer = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def publish(text):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
# Until a rank imports mlflow (it creates PATH.want), the launch ends (a line on stdin) or
# `defer` seconds pass, wait: importing mlflow is seconds of CPU, and any CPU taken while the
# ranks start (import torch, ...) is start-up time lost, however low its priority.
end = time.monotonic() + defer
while time.monotonic() < end and not os.path.exists(path + ".want"):
    if select.select([sys.stdin], [], [], 0.05)[0]:
        break
if importlib.util.find_spec("mlflow") is None:
    publish("NONE=mlflow is not installed\n")
    sys.exit(0)
try:
    import mlflow
    from mlflow.tracking import MlflowClient
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        # mlflow's own default is ./mlflow.db: a database in every directory a job starts from.
        state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        os.makedirs(os.path.join(state, "airhost"), mode=0o700, exist_ok=True)
        mlflow.set_tracking_uri("sqlite:///" + os.path.join(state, "airhost", "mlflow.db"))
    exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
    if not exp_id:
        exp_id = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or "airhost").experiment_id
    tags = {"airhost.entry": name}
    parent = os.environ.get("MLFLOW_RUN_ID")
    if parent:
        tags["mlflow.parentRunId"] = parent
    client = MlflowClient()
    resume = os.environ.pop("AIRHOST_MLFLOW_RESUME", "")
    if resume:  # a requeued job goes on in its run
        run_id = resume
        exp_id = client.get_run(run_id).info.experiment_id
        client.update_run(run_id, status="RUNNING")
    else:
        run_id = client.create_run(exp_id, tags=tags, run_name=os.path.basename(name)).info.run_id
        client.log_param(run_id, "num_accelerators", nprocs)
    uri = mlflow.get_tracking_uri()
except Exception as e:
    publish("NONE=%s\n" % str(e).replace("\n", " "))
    print("airhost: mlflow is installed but no run could be created (%s); training without tracking "
          "(check MLFLOW_TRACKING_URI, or pass --no-tracking)" % str(e).splitlines()[0][:300], file=sys.stderr, flush=True)
    sys.exit(0)
lines = ["MLFLOW_RUN_ID=" + run_id, "MLFLOW_TRACKING_URI=" + uri, "MLFLOW_EXPERIMENT_ID=" + exp_id]
if uri.startswith("sqlite:"):
    lines.append("AIRHOST_MLFLOW_RETRY=1")
publish("\n".join(lines) + "\n")
if uri.startswith(("http://", "https://", "databricks")):
    where = "%s/#/experiments/%s/runs/%s" % (uri.rstrip("/"), exp_id, run_id)
else:
    where = "run %s; view it with: mlflow ui --backend-store-uri %s" % (run_id, uri)
print("airhost: MLflow " + where, file=sys.stderr, flush=True)
status = sys.stdin.readline().strip() or "KILLED"
try:
    client.set_terminated(run_id, status=status)
except Exception as e:
    print("airhost: could not set MLflow run %s to %s: %s" % (run_id, status, e), file=sys.stderr, flush=True)
    sys.exit(1)
# Each attempt's group and why it began (run.json, written before the status), when the group
# changed or restarted: an elastic job's nodes come and go between attempts.
try:
    import json
    with open(os.path.join(os.path.dirname(path), "run.json")) as f:
        attempts = json.load(f).get("attempts", [])
    if len(attempts) > 1:
        client.set_tag(run_id, "airhost.attempts", json.dumps(attempts)[:5000])
        client.set_tag(run_id, "airhost.nnodes", " -> ".join(str(a.get("nnodes")) for a in attempts)[:5000])
except Exception as e:
    print("airhost: could not record the attempts in MLflow run %s: %s" % (run_id, e), file=sys.stderr, flush=True)
# What each rank used, sampled by the host (launch/watch/rank_usage.hpp): system metrics per rank,
# after the status, so that the host's bounded wait for this helper never costs the status.
# log_rank_usage comes before this text (kUsageMetricsSource).
try:
    log_rank_usage(client, run_id, os.path.join(os.path.dirname(path), "metrics", "ranks.jsonl"))
except Exception as e:
    print("airhost: could not log the ranks' CPU and memory to MLflow run %s: %s" % (run_id, e), file=sys.stderr, flush=True)
)PY";

// How long the run's creation may wait for a rank to need it: past the ranks' start-up.
constexpr int kDeferSeconds = 15;

const char* status_of(Outcome outcome) {
  return outcome == Outcome::succeeded ? "FINISHED" : outcome == Outcome::interrupted ? "KILLED" : "FAILED";
}

}  // namespace

TrackingRun TrackingRun::start(const std::string& python, const std::string& run_name, int nprocs,
                               const std::string& env_file, const std::string& resume_run_id) {
  TrackingRun run;
  if (!resume_run_id.empty()) ::setenv("AIRHOST_MLFLOW_RESUME", resume_run_id.c_str(), 1);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) < 0) return run;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[0], STDIN_FILENO);  // dup2 clears CLOEXEC
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  const std::string py = python.empty() ? "python3" : python;
  const std::string count = std::to_string(nprocs);
  const std::string defer = std::to_string(kDeferSeconds);
  const std::string helper = std::string(kUsageMetricsSource) + kHelper;
  std::vector<const char*> argv = {py.c_str(), "-c",           helper.c_str(), env_file.c_str(),
                                   run_name.c_str(), count.c_str(), defer.c_str(), nullptr};
  // A process group of its own: the terminal's Ctrl-C and Ctrl-\ go to the foreground group,
  // which would kill the helper (SIGQUIT dumps core) before it marks the run, leaving it
  // RUNNING. It ends when the host says so: the status line, or EOF when the host is gone.
  // It starts with an empty signal mask, whatever the calling thread blocks.
  const HelperSpawnAttr attr;
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, py.c_str(), &actions, attr.get(), const_cast<char* const*>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::unsetenv("AIRHOST_MLFLOW_RESUME");  // the helper's alone, not the ranks'
  ::close(pipefd[0]);
  if (rc != 0) {
    ::close(pipefd[1]);
    std::fprintf(stderr, "airhost: cannot start %s for MLflow tracking (%s); training without tracking\n", py.c_str(),
                 std::strerror(rc));
    return run;
  }
  run.pid_ = pid;
  run.status_fd_ = pipefd[1];
  run.env_file_ = env_file;
  return run;
}

std::map<std::string, std::string> TrackingRun::rank_env() const {
  if (pid_ < 0) return {};
  return {{"AIRHOST_MLFLOW_PENDING", env_file_}};
}

void TrackingRun::finish(Outcome outcome) {
  if (pid_ < 0) return;
  const std::string line = std::string(status_of(outcome)) + "\n";
  write_all(status_fd_, line);  // fails harmlessly when the helper already left (no mlflow)
  ::close(status_fd_);
  status_fd_ = -1;
  // Setting a status is one request; a tracking server that does not answer in 30 s is not
  // worth holding the exit of a finished run for.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "airhost: the MLflow helper did not finish in 30 s; its run may stay RUNNING\n");
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
}

TrackingRun::~TrackingRun() {
  if (status_fd_ >= 0) ::close(status_fd_);  // the helper reads EOF and marks the run KILLED
  if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
}

TrackingRun::TrackingRun(TrackingRun&& other) noexcept { *this = std::move(other); }

TrackingRun& TrackingRun::operator=(TrackingRun&& other) noexcept {
  if (this != &other) {
    std::swap(pid_, other.pid_);
    std::swap(status_fd_, other.status_fd_);
    std::swap(env_file_, other.env_file_);
  }
  return *this;
}

}  // namespace airhost::detail
