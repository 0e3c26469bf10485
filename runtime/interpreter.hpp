// interpreter.hpp — one embedded CPython per rank, configured through PyConfig.
#pragma once

#include <string>
#include <vector>

namespace airhost::rank {

// What a rank runs, decoded from airhost-rank's command line.
struct RankArgs {
  std::string kind;      // script | module | function-script | function-module | pickled
  std::string target;    // script path, module name or payload path
  std::string function;  // function-* kinds
  std::string python;    // the interpreter whose environment (venv, site-packages) to use
  std::string result_format = "pickle";  // or "json"
  std::vector<std::string> args;  // sys.argv[1:]
};

// Starts the interpreter as `python` would for this entry, runs it and finalizes.
// Returns the process exit code (SystemExit honoured exactly as python does).
int run_interpreter(const RankArgs& args);

// airhost-rank --warm-server: an interpreter with modules preloaded that forks ranks on
// request (runtime/warm.py, host/launch/rank/warm_starter.hpp). Returns the server's exit code in the
// server and the rank's exit code in each forked rank.
struct WarmArgs {
  std::string socket;      // unix socket path to listen on
  std::string preload;     // "auto", "none" or "mod,mod"
  std::string python;
  std::string parent_pid;  // non-empty: exit when this process dies (the Python API's caller)
};
int run_warm_server(const WarmArgs& args);

}  // namespace airhost::rank
