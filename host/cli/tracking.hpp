// tracking.hpp — an MLflow run per `airhost` launch, made beside the ranks' start, not before it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

#include "airhost/report.hpp"

namespace airhost::detail {

// One launch's MLflow run. Creating a run costs an interpreter start and `import mlflow`
// (a second or more of CPU); done before the ranks start, every launch would wait for it, and
// done beside their start it still slows them by as much on a busy node, whatever its CPU
// priority (measured: a SCHED_IDLE spinner costs 4 ranks' `import torch` 25% on 2 cores).
// So a helper process waits until a rank imports mlflow, the launch ends, or 15 s have
// passed, then creates the run and writes its variables (MLFLOW_RUN_ID, MLFLOW_TRACKING_URI,
// MLFLOW_EXPERIMENT_ID) to `env_file` in the run directory. A rank binds the run when it
// imports mlflow (bootstrap.py: it asks for the run with `env_file`.want and waits for the
// file), so a rank that never touches mlflow never waits, and one that does waits about the
// time of its own `import mlflow`, done beside the helper's.
//
// The helper stays until finish() tells it the launch's outcome, which it sets as the run's
// status (FINISHED, FAILED or KILLED) with the mlflow it already imported. Never throws:
// tracking is an extra, never a reason not to train.
class TrackingRun {
 public:
  TrackingRun() = default;
  // Starts the helper with `python` (the ranks' interpreter); `run_name` names the run.
  // Without mlflow there, the helper writes "NONE=..." and leaves.
  // `resume_run_id`: go on in this run (a requeued job's) instead of creating one.
  static TrackingRun start(const std::string& python, const std::string& run_name, int nprocs,
                           const std::string& env_file, const std::string& resume_run_id = "");
  ~TrackingRun();
  TrackingRun(TrackingRun&& other) noexcept;
  TrackingRun& operator=(TrackingRun&& other) noexcept;
  TrackingRun(const TrackingRun&) = delete;
  TrackingRun& operator=(const TrackingRun&) = delete;

  // What every rank needs: AIRHOST_MLFLOW_PENDING=<env_file>. Empty when not started.
  std::map<std::string, std::string> rank_env() const;

  // Ends the run by the outcome and waits (a bounded time) for the helper to exit.
  void finish(Outcome outcome);

 private:
  pid_t pid_ = -1;
  int status_fd_ = -1;  // the helper's stdin: one line, the final status
  std::string env_file_;
};

}  // namespace airhost::detail
