// libpython.hpp — which libpython a rank embeds, found at run time.
//
// A wheel is built on one machine and installed on another, so airhost-rank links no
// libpython: it loads the one of the interpreter it is told to use (--python, or the python3
// beside it in the environment's bin/), then the Python half of the rank
// (libairhost-rank-py.so, runtime/rank_entry.cpp) whose Python symbols resolve against it.
#pragma once

#include <string>
#include <vector>

namespace airhost::rank {

struct LibPythonSearch {
  std::string python;                 // the interpreter whose libpython is wanted ("" if none known)
  std::string version;                // "3.11": the one this rank runtime was compiled for
  std::vector<std::string> dirs;      // folders tried, in order, for libpython<version>.so.1.0
};

// Where to look for `version`'s libpython, for the interpreter `python` (a venv's bin/python,
// a symlink to pyenv's, Debian's /usr/bin/python3, conda's, uv's): the prefix of the file the
// path resolves to, then the `home` of the venv it sits in (pyvenv.cfg), in that order. Pure:
// it reads the file system, loads nothing.
LibPythonSearch libpython_search(const std::string& python, const std::string& version);

// Loads libpython for `search` with RTLD_GLOBAL, as python itself would have it for extension
// modules: $AIRHOST_LIBPYTHON if set, else search.dirs, else what the interpreter's own
// sysconfig names (Debian's multiarch libpython3.X), else the system's library path. Returns "" on success, or
// one sentence saying what is wrong and what to do (a Python built without --enable-shared,
// a missing libpython3.X package).
std::string load_libpython(const LibPythonSearch& search);

// The Python half of the rank runtime beside airhost-rank (`exe_dir`): in the same folder (a
// build tree) or in ../lib/airhost (pip's scripts and data folders, cmake --install).
std::vector<std::string> rank_library_candidates(const std::string& exe_dir);

}  // namespace airhost::rank
