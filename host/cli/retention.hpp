// retention.hpp — run directories do not pile up: which runs a retention policy removes
// (pure, doctested), how large a run directory is, and `airhost runs prune` / `runs keep`.
//
// A policy bounds the runs root three ways, each optional: runs older than `older_than`
// (by their end, else their start), more runs than `keep` (the newest are kept), and more
// than `max_bytes` in all (the oldest go first). Only a run that has ended (or is lost) may
// go: never one running, starting, pending or requeued on a scheduler, or one whose state
// nothing here can tell, never one of a Slurm job that Slurm does not say is over, and never
// one the user kept (`airhost runs keep ID`: a `keep` file in its directory). MLflow's store is never touched (`mlflow gc` prunes it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/run_records.hpp"

namespace airhost::detail {

struct RetentionPolicy {
  std::optional<double> older_than_seconds;
  std::optional<long> keep;
  std::optional<std::uint64_t> max_bytes;
  bool any() const { return older_than_seconds || keep || max_bytes; }
};

// What every launch applies when it ends, unless told otherwise: 30 days, 1000 runs, 20 GiB.
RetentionPolicy default_retention();

// "off" → no policy; "older_than=7d,keep=100,max_size=5G" (any of the three, any order);
// ConfigError naming `what` otherwise. The AIRHOST_RETENTION variable's form.
RetentionPolicy parse_retention(const std::string& text, const std::string& what);

// "20G", "512M", "1.5T", "4096" (bytes; K, M, G, T are powers of 1024) → bytes.
std::uint64_t parse_size(const std::string& text, const std::string& what);

struct PruneCandidate {
  const RunRecord* run;
  std::uint64_t bytes = 0;
  bool kept = false;       // `airhost runs keep`
  bool job_alive = false;  // its Slurm job lives on (or Slurm cannot say), whatever run.json says
};

struct PruneVictim {
  std::string id;
  std::string dir;
  std::uint64_t bytes = 0;
  std::string why;  // "older than 7d", "beyond the newest 100 runs", "over 5 GiB in all"
};

// The runs the policy removes, oldest first. `runs` newest first (list_runs' order).
std::vector<PruneVictim> plan_prune(const std::vector<PruneCandidate>& runs, const RetentionPolicy& policy, double now);

// Bytes a directory takes on disk (its files' allocated blocks), walked without following links.
std::uint64_t dir_bytes(const std::string& dir);

// What `airhost runs` and `runs show` add to a record: its size on disk and whether it is kept.
void measure_run(RunRecord& r);

// Applies `policy` to the runs root: removes the victims (unless `dry_run`) and returns them.
std::vector<PruneVictim> prune_runs(const std::string& root, const RetentionPolicy& policy, bool dry_run);

// The policy a launch applies when it ends: the config's `retention` if given, else
// AIRHOST_RETENTION if set, else the defaults.
RetentionPolicy launch_retention(const std::optional<std::string>& configured = std::nullopt);

// `airhost runs prune ...` and `airhost runs keep ID [--undo]`.
int runs_prune_command(const std::vector<std::string>& args);
int runs_keep_command(const std::vector<std::string>& args);

}  // namespace airhost::detail
