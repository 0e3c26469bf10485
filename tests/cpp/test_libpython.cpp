// Where airhost-rank looks for the libpython of the Python it runs (runtime/libpython.cpp), in
// the layouts users have: a venv over pyenv's Python (a symlink), a venv made with --copies
// (pyvenv.cfg), and the signal names that replaced glibc 2.32's sigabbrev_np.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "base/util.hpp"
#include "libpython.hpp"

namespace fs = std::filesystem;
using airhost::rank::libpython_search;
using airhost::rank::rank_library_candidates;

namespace {
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/airhost-libpython-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};
void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "";
}
}  // namespace

TEST_CASE("a venv's python is a symlink: libpython is looked for in the prefix it resolves to") {
  TempDir t;
  touch(t.path / "pyenv/3.11.7/bin/python3.11");
  fs::create_directories(t.path / "venv/bin");
  fs::create_symlink(t.path / "pyenv/3.11.7/bin/python3.11", t.path / "venv/bin/python");
  auto s = libpython_search((t.path / "venv/bin/python").string(), "3.11");
  REQUIRE(!s.dirs.empty());
  CHECK(s.dirs.front() == (t.path / "pyenv/3.11.7/lib").string());
  CHECK(s.version == "3.11");
}

TEST_CASE("a venv made with --copies names its base Python's bin/ in pyvenv.cfg, which is looked in too") {
  TempDir t;
  touch(t.path / "venv/bin/python");
  touch(t.path / "base/bin/python3.12");
  std::ofstream(t.path / "venv/pyvenv.cfg") << "include-system-site-packages = false\nhome = " << (t.path / "base/bin").string()
                                            << "\nversion = 3.12.1\n";
  auto s = libpython_search((t.path / "venv/bin/python").string(), "3.12");
  CHECK(s.dirs.front() == (t.path / "venv/lib").string());  // where the file itself is
  CHECK(std::find(s.dirs.begin(), s.dirs.end(), (t.path / "base/lib").string()) != s.dirs.end());
}

TEST_CASE("with no interpreter known there is nowhere of its own to look (the system's path remains)") {
  CHECK(libpython_search("", "3.11").dirs.empty());
}

TEST_CASE("the rank's Python half is beside airhost-rank (a build tree) or in ../lib/airhost (pip, cmake --install)") {
  auto c = rank_library_candidates("/env/bin");
  REQUIRE(c.size() == 2);
  CHECK(c[0] == "/env/bin/libairhost-rank-py.so");
  CHECK(c[1] == "/env/lib/airhost/libairhost-rank-py.so");
}

TEST_CASE("signals are named as the kernel names them, without glibc 2.32's sigabbrev_np") {
  CHECK(airhost::detail::signal_name(9) == "SIGKILL");
  CHECK(airhost::detail::signal_name(15) == "SIGTERM");
  CHECK(airhost::detail::signal_name(11) == "SIGSEGV");
  CHECK(airhost::detail::signal_name(31) == "SIGSYS");
  CHECK(airhost::detail::signal_name(40) == "signal 40");
}
