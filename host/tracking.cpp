#include "tracking.hpp"

#include <cstdio>

#include "util.hpp"

namespace airhost::detail {
namespace {

// Run in the ranks' interpreter with -c, so it needs nothing of airhost there, and costs
// one interpreter start (no mlflow import) when mlflow is absent. Prints KEY=VALUE lines;
// MESSAGE is for the user.
constexpr const char* kStart = R"PY(
import importlib.util, os, sys
if importlib.util.find_spec("mlflow") is None:
    sys.exit(0)
import mlflow
from mlflow.tracking import MlflowClient
name, nprocs = sys.argv[1], sys.argv[2]
exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
if not exp_id:
    exp_id = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or "airhost").experiment_id
tags = {"airhost.entry": name}
parent = os.environ.get("MLFLOW_RUN_ID")
if parent:
    tags["mlflow.parentRunId"] = parent
client = MlflowClient()
run = client.create_run(exp_id, tags=tags, run_name=os.path.basename(name))
client.log_param(run.info.run_id, "num_accelerators", nprocs)
uri = mlflow.get_tracking_uri()
if uri.startswith(("http://", "https://", "databricks")):
    where = f"{uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run.info.run_id}"
else:
    where = f"run {run.info.run_id}; view it with: mlflow ui --backend-store-uri {uri}"
print(f"MLFLOW_RUN_ID={run.info.run_id}\nMLFLOW_TRACKING_URI={uri}\nMLFLOW_EXPERIMENT_ID={exp_id}\nMESSAGE=airhost: MLflow {where}")
if uri.startswith("sqlite:"):
    print("AIRHOST_MLFLOW_RETRY=1")
)PY";

constexpr const char* kFinish = R"PY(
import sys
from mlflow.tracking import MlflowClient
MlflowClient().set_terminated(sys.argv[1], status=sys.argv[2])
)PY";

}  // namespace

std::map<std::string, std::string> start_tracking(const std::string& python, const std::string& run_name,
                                                  int nprocs) {
  std::map<std::string, std::string> env;
  const std::string py = python.empty() ? "python3" : python;
  const std::string cmd = shell_quote(py) + " -c " + shell_quote(kStart) + " " + shell_quote(run_name) + " " +
                          std::to_string(nprocs) + " 2>/dev/null";
  std::string out;
  const int rc = run_capture(cmd, out);
  if (rc == -1) return env;
  std::string message;
  std::size_t at = 0;
  while (at < out.size()) {
    std::size_t nl = out.find('\n', at);
    std::string line = out.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? out.size() : nl + 1;
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    if (line.compare(0, eq, "MESSAGE") == 0) message = line.substr(eq + 1);
    else env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (rc != 0 || !env.count("MLFLOW_RUN_ID")) {
    if (rc != 0)
      std::fprintf(stderr, "airhost: mlflow is installed but no run could be created; training without "
                           "tracking (check MLFLOW_TRACKING_URI, or pass --no-tracking)\n");
    return {};
  }
  if (!message.empty()) std::fprintf(stderr, "%s\n", message.c_str());
  return env;
}

void finish_tracking(const std::string& python, const std::map<std::string, std::string>& env, Outcome outcome) {
  auto id = env.find("MLFLOW_RUN_ID");
  if (id == env.end()) return;
  const char* status = outcome == Outcome::succeeded ? "FINISHED" : outcome == Outcome::interrupted ? "KILLED" : "FAILED";
  const std::string py = python.empty() ? "python3" : python;
  const std::string cmd = shell_quote(py) + " -c " + shell_quote(kFinish) + " " + shell_quote(id->second) + " " + status;
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "airhost: could not set MLflow run %s to %s\n", id->second.c_str(), status);
}

}  // namespace airhost::detail
