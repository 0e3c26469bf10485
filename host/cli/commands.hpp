// commands.hpp — the CLI's commands besides a launch (main.cpp): each in its own file.
#pragma once

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

// `--print-env`: where this node's place in the job came from, and each local rank's
// environment (print_env.cpp).
int print_env(const LaunchSpec& spec, const ClusterResolution& cluster);

// `--preflight`: the quick checks that catch a bad node before hours are committed to it;
// the problems found, one sentence each (preflight.cpp).
std::vector<std::string> preflight(const LaunchSpec& spec);

}  // namespace airhost::detail
