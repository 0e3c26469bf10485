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

}  // namespace airhost::rank
