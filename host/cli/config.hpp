// config.hpp — TOML configuration: configs/default.toml documents every key.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.hpp"

namespace airhost::detail {

// Where `airhost submit --to slurm` asks Slurm to run a job ([slurm] of the file, submit's
// flags): each becomes one #SBATCH line of the batch script (cli/slurm_target.hpp).
struct SlurmSettings {
  std::optional<std::string> partition;     // --partition
  std::optional<std::string> account;       // --account
  std::optional<std::string> qos;           // --qos
  std::optional<std::string> time;          // --time, in Slurm's own form ("2:00:00", "90")
  std::optional<int> gpus_per_node;         // --gpus-per-node
  std::optional<int> cpus_per_task;         // --cpus-per-task (the one task per node holds every rank)
  std::optional<std::string> mem;           // --mem ("64G")
  std::optional<std::string> constraint;    // --constraint
  std::vector<std::string> extra;           // more #SBATCH lines, each as sbatch takes it ("--exclusive")
  std::optional<std::string> signal;        // the warning before the time limit: "USR1@90" (the default),
                                            // USR1 or USR2 @ seconds, or "off"
  std::optional<bool> requeue;              // requeue the job when it stops after the warning

  void merge(const SlurmSettings& over);    // given fields of `over` win; extra lines add up
};

// "USR1@90" → itself; "off" → ""; anything else: ConfigError naming `what`.
std::string checked_warning_signal(const std::string& text, const std::string& what);

// Every setting a file or the command line can give. std::nullopt = not given, so that
// the layers (defaults < file < flags) merge by "later given wins"; a setting given by no
// layer takes the built-in default (LaunchSpec's, written out in configs/default.toml).
struct Settings {
  std::optional<int> accelerators;               // ranks; 0 or absent = auto
  std::optional<std::chrono::seconds> timeout;   // 0 = disabled
  std::optional<std::chrono::milliseconds> grace;
  std::optional<std::chrono::milliseconds> hang_timeout;  // 0 = off
  std::optional<bool> stop_on_hang;              // on_hang = "stop" (true) or "report"
  std::optional<std::string> python;             // "" = the default interpreter
  std::optional<std::string> run_dir;            // "" = <runs root>/<run id>
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> max_restarts;               // restarts of the whole group after a rank fails
  std::optional<int> nnodes;                     // nodes in the job (torchrun's --nnodes); MAX of MIN:MAX
  std::optional<int> nnodes_min;                 // MIN of --nnodes MIN:MAX; unset: exactly nnodes (set with nnodes)
  std::optional<std::chrono::milliseconds> join_settle;  // elastic: the quiet time after MIN joined
  std::optional<std::chrono::milliseconds> scale_up_interval;  // elastic: the least time between two restarts that take nodes in
  std::optional<int> node_rank;                  // this node's rank among them (GROUP_RANK)
  std::optional<std::chrono::seconds> node_timeout;  // another node silent this long is lost
  std::optional<std::chrono::seconds> join_timeout;  // how long the nodes may take to join
  std::optional<std::string> join_token_file;        // the job's join token, first line of this file
  std::optional<bool> preflight;
  std::optional<bool> tracking;                  // an MLflow run per launch, when mlflow is importable
  std::optional<std::string> experiment;         // its MLflow experiment (over MLFLOW_EXPERIMENT_NAME)
  std::optional<std::uint64_t> log_max_bytes;    // bound of each rank log (0 = none)
  std::optional<std::string> retention;          // "off" or "older_than=30d,keep=1000,max_size=20G" (retention.hpp)
  std::optional<std::string> preload;            // warm server modules, "torch,numpy"; "auto" = torch if installed
  std::optional<bool> warm;                      // use a running warm server (default true)
  std::optional<bool> prefix;                    // [output] prefix
  std::optional<std::set<int>> ranks;            // [output] ranks; empty = all ranks
  std::map<std::string, std::string> env;        // [env]
  SlurmSettings slurm;                           // [slurm]: airhost submit --to slurm only

  // Fields given in `over` replace ours; env maps merge with `over` winning.
  void merge(const Settings& over);
};

// Parses TOML text; `origin` names it in error messages (a path, or "<string>").
Settings parse_config(std::string_view toml_text, const std::string& origin);
Settings load_config_file(const std::string& path);

// "90", "90s", "15m", "3h", "1h30m", "500ms", "2d" → duration. Units go from largest to
// smallest, each at most once. Throws ConfigError naming `what` and the text.
std::chrono::milliseconds parse_duration(std::string_view text, const std::string& what);

// parse_duration for a setting kept in whole seconds (the timeout): "1500ms" is an error
// rather than a silent rounding, since rounding "500ms" down would disable the timeout.
std::chrono::seconds parse_duration_seconds(std::string_view text, const std::string& what);

// A node count, "N" or elastic "MIN:MAX" (torchrun's --nnodes): {MIN, MAX}, MIN == MAX for "N";
// nullopt when the text is neither, or MIN < 1 or MAX < MIN.
std::optional<std::pair<int, int>> parse_node_count(std::string_view text);

// The candidate closest to `word` by edit distance, if close enough to be a likely typo;
// for "did you mean" hints in config and command-line errors.
std::optional<std::string> closest_name(std::string_view word,
                                        const std::vector<std::string>& candidates);

}  // namespace airhost::detail
