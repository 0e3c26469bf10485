// files.hpp — whole-file reads and writes that a reader never sees half of.
#pragma once

#include <functional>
#include <string>

namespace airhost::detail {

// Creates `path` and its parents, mode 0700 for what it creates. Throws std::system_error
// naming the path when it cannot.
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

// Reads `fd` until end of file into `out` (appended), retrying EINTR. With `timeout_ms` >= 0,
// gives up once that long has passed without the end: returns false then (what came is in
// `out`). A read error ends the read as end of file does.
bool read_to_end(int fd, std::string& out, int timeout_ms = -1);

// The whole file at `path` into `out`; false when it cannot be opened.
bool read_file(const std::string& path, std::string& out);

}  // namespace airhost::detail
