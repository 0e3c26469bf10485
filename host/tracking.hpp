// tracking.hpp — an MLflow run per `airhost` launch, as the Python API makes per call.
#pragma once

#include <map>
#include <string>

#include "airhost/report.hpp"

namespace airhost::detail {

// Creates a run with `python` (the ranks' interpreter) when it can import mlflow, in the
// experiment of MLFLOW_EXPERIMENT_NAME/_ID or "airhost", nested under MLFLOW_RUN_ID if the
// caller has one. Returns the variables that point the ranks at it (MLFLOW_RUN_ID,
// MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID), empty when mlflow is not there; prints where
// to see the run. Never throws: tracking is an extra, never a reason not to train.
std::map<std::string, std::string> start_tracking(const std::string& python, const std::string& run_name,
                                                  int nprocs);

// Sets the run's final status by the outcome (FINISHED, FAILED or KILLED), whatever the
// ranks' own exit handlers said.
void finish_tracking(const std::string& python, const std::map<std::string, std::string>& env, Outcome outcome);

}  // namespace airhost::detail
