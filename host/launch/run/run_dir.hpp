// run_dir.hpp — the run directory: logs, payload, results, run.json. Mode 0700.
#pragma once

#include <string>

#include "base/files.hpp"  // make_dirs, write_file_atomic, append_file: what run files are written with

namespace airhost::detail {

// "20261202-141503-3fa9c1": sortable by start time, unique across concurrent launches.
std::string make_run_id();

// Creates `path` and its parents (0700 for what it creates) plus `logs/`. Throws
// std::system_error naming the path when it cannot.
void create_run_dir(const std::string& path);

}  // namespace airhost::detail
