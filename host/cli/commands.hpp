// commands.hpp — the CLI's commands besides a launch (main.cpp): each in its own file.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "airhost/launch.hpp"
#include "cli/cluster_env.hpp"
#include "cli/command_line.hpp"

namespace airhost::detail {

// "airhost: MESSAGE" and the --help hint on stderr; returns the usage exit code (2).
int usage_error(const std::string& message);

// `airhost doctor [--json]` (doctor_command.cpp).
int doctor_command(const HostOptions& opts);

// `airhost warm start|stop|status` (warm_command.cpp).
int warm_command(const HostOptions& opts);

// `airhost runs [--json] | runs show ID`, `airhost logs ID [...]`, `airhost cancel ID`
// (run_commands.cpp): the runs root read back. `word` is the first argument, `args` the rest.
bool is_run_command(const std::string& word);
int run_command(const std::string& word, const std::vector<std::string>& args);

// `airhost stacks [ID] [--json] [--all-threads]` (stacks_command.cpp): every rank's Python
// stacks of a live run, from its host's socket (launch/watch/stacks_service.hpp). Throws ConfigError
// for bad input (no live run, an unknown or ambiguous id, an ended run, another user's run).
int stacks_command(const std::vector<std::string>& args);

// `airhost submit [--to local|slurm] [--watch] [--dry-run] LAUNCH...` (submit_command.cpp).
int submit_command(const std::vector<std::string>& args);

// A submitted launch (submit_command.cpp) is an `airhost LAUNCH...` started detached with two
// variables: the run id the submitter chose and printed, and a descriptor on which the host
// writes one byte once its launch has passed its checks (then closes it), so that the
// submitter can say "refused" or "submitted" truthfully. main.cpp reads and unsets both.
inline constexpr const char* kSubmitRunIdVar = "AIRHOST_SUBMIT_RUN_ID";
inline constexpr const char* kSubmitReadyFdVar = "AIRHOST_SUBMIT_READY_FD";

// `--print-env`: where this node's place in the job came from, and each local rank's
// environment (print_env.cpp).
int print_env(const LaunchSpec& spec, const ClusterResolution& cluster);

// `--preflight`: the quick checks that catch a bad node before hours are committed to it;
// the problems found, one sentence each (preflight.cpp).
std::vector<std::string> preflight(const LaunchSpec& spec);

// `airhost logs --tail N`: the offset where the last `lines` lines of the file at `path` begin
// (its size for 0; 0 when it has fewer lines), found reading back from the end in blocks.
off_t tail_offset(const std::string& path, long lines);

}  // namespace airhost::detail
