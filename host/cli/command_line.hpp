// command_line.hpp — argv → one typed HostOptions, before anything runs.
#pragma once

#include <string>
#include <vector>

#include "airhost/launch.hpp"
#include "cli/config.hpp"

namespace airhost::detail {

enum class Command { run, help, version, doctor, warm };

struct HostOptions {
  Command command = Command::run;
  Settings settings;                 // defaults < config file < flags, already merged
  Settings flags;                    // the command line's settings alone (where a value came from)
  std::string config_path;           // the file that was read, empty if none
  Entry entry;                       // what to run (Command::run)
  // Whether entry.target is a dotted module name (`-m pkg.mod`, `-m pkg.mod:main`) rather
  // than a script path. Entry::Kind alone can't tell `train.py:main` from `-m pkg:main`:
  // both are Kind::function.
  bool module_target = false;
  bool json = false;                 // doctor --json
  bool print_env = false;            // --print-env: say what a launch would use, start nothing
  std::string warm_action;           // Command::warm: start | stop | status
};

// Parses `airhost [flags] TARGET [flags] [-- script args]`, where TARGET is `train.py`,
// `train.py:main`, or `-m pkg.mod[:main]`. Flags may come before or after TARGET; script
// arguments only after `--`. Reads `--config FILE`, else `airhost.toml` in `cwd` if present.
// Throws ConfigError with one clear sentence on any bad input.
//
// `PATH:NAME` is a function only when NAME is a Python identifier; otherwise the whole
// text is a script path. The script's existence is not checked here. `doctor` as the first
// positional word is the subcommand. -h/--help and -V/--version anywhere before `--` win
// over every other argument, even a bad one, and no config file is read for them.
// Absent settings mean the built-in defaults (LaunchSpec's); nothing is filled in here.
HostOptions parse_command_line(const std::vector<std::string>& argv, const std::string& cwd);

// The text of `airhost --help`.
std::string usage_text();

}  // namespace airhost::detail
