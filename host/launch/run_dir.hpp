// run_dir.hpp — the run directory: logs, payload, results, run.json. Mode 0700.
#pragma once

#include <functional>
#include <string>

namespace airhost::detail {

// "20261202-141503-3fa9c1": sortable by start time, unique across concurrent launches.
std::string make_run_id();

// Creates `path` and its parents (0700 for what it creates) plus `logs/`. Throws
// std::system_error naming the path when it cannot.
void create_run_dir(const std::string& path);

// Creates `path` and its parents, mode 0700 for what it creates.
void make_dirs(const std::string& path);

// Writes `data` to `path` (0600) via a temporary file and rename, so readers never see half.
void write_file_atomic(const std::string& path, const std::string& data);
// The same, with `write` filling the temporary file (it throws to give up: nothing is left).
void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write);

// Appends `data` to `path` (created 0600). Best effort: returns false when it cannot.
bool append_file(const std::string& path, const std::string& data);

// True when the file at `path` is empty or missing, or its last byte is a '\n': what is
// appended next starts a line.
bool ends_line(const std::string& path);

}  // namespace airhost::detail
