#include "libpython.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace airhost::rank {
namespace {

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string{};
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// `home = /path/to/bin` of the pyvenv.cfg of the venv holding `python` (venv/bin/python).
std::string venv_home(const std::string& python) {
  std::ifstream cfg(dirname_of(dirname_of(python)) + "/pyvenv.cfg");
  for (std::string line; std::getline(cfg, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos && trim(line.substr(0, eq)) == "home") return trim(line.substr(eq + 1));
  }
  return "";
}

std::string soname(const std::string& version) { return "libpython" + version + ".so.1.0"; }

// What the interpreter itself says of its libpython: Py_ENABLE_SHARED, LIBDIR, INSTSONAME.
// Asked only when nothing above was found (an unusual layout): it costs a Python start.
struct Sysconfig {
  bool ran = false;
  bool shared = false;
  std::string libdir, instsoname;
};

Sysconfig ask_interpreter(const std::string& python) {
  Sysconfig sc;
  std::string quoted = "'";
  for (char c : python) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = quoted +
                          " -c 'import sysconfig as s; v = s.get_config_var; "
                          "print(v(\"Py_ENABLE_SHARED\") or 0); print(v(\"LIBDIR\") or \"\"); "
                          "print(v(\"INSTSONAME\") or \"\")' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return sc;
  std::string out;
  char buf[1024];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) return sc;
  std::string lines[3];
  size_t at = 0;
  for (auto& l : lines) {
    const auto nl = out.find('\n', at);
    l = out.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? out.size() : nl + 1;
  }
  sc.ran = true;
  sc.shared = trim(lines[0]) == "1";
  sc.libdir = trim(lines[1]);
  sc.instsoname = trim(lines[2]);
  return sc;
}

bool open_global(const std::string& path, std::string& error) {
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return true;
  const char* e = ::dlerror();
  if (error.empty() && e) error = e;
  return false;
}

}  // namespace

LibPythonSearch libpython_search(const std::string& python, const std::string& version) {
  LibPythonSearch s;
  s.python = python;
  s.version = version;
  auto add = [&](const std::string& dir) {
    if (dir.empty()) return;
    for (const auto& d : s.dirs)
      if (d == dir) return;
    s.dirs.push_back(dir);
  };
  if (python.empty()) return s;
  // pyenv's, conda's, uv's and python.org's layouts: PREFIX/bin/python3.X, PREFIX/lib/libpython.
  // A venv's bin/python is a symlink to such a file, so this covers venvs over them too.
  if (const std::string real = real_path(python); !real.empty()) add(dirname_of(dirname_of(real)) + "/lib");
  // A venv made with --copies: its python is no symlink, its pyvenv.cfg names the base's bin/.
  if (const std::string home = venv_home(python); !home.empty()) {
    add(dirname_of(home) + "/lib");
    if (const std::string real = real_path(home); !real.empty()) add(dirname_of(real) + "/lib");
  }
  return s;
}

std::string load_libpython(const LibPythonSearch& search) {
  std::string error;
  if (const char* forced = std::getenv("AIRHOST_LIBPYTHON"); forced && *forced) {
    if (open_global(forced, error)) return "";
    return "AIRHOST_LIBPYTHON=" + std::string(forced) + " does not load (" + error +
           "); point it at the libpython" + search.version + ".so.1.0 of the Python the ranks should run, or unset it";
  }
  const std::string name = soname(search.version);
  for (const auto& dir : search.dirs) {
    const std::string path = dir + "/" + name;
    if (is_file(path) && open_global(path, error)) return "";
  }
  const std::string who = search.python.empty() ? std::string("this environment's Python")
                                                : "the Python at " + search.python;
  // An unusual layout (Debian's python3, whose libpython lives in the multiarch folder):
  // the interpreter itself says where its own is. Asked before the system's library path, so
  // that a Python with none is told so instead of running on another build's libpython.
  if (!search.python.empty()) {
    const Sysconfig sc = ask_interpreter(search.python);
    if (sc.ran && !sc.shared)
      return who + " (" + search.version + ") has no shared libpython: it was built without --enable-shared, "
             "and each rank embeds one. Use a Python that has it (python.org's, Debian/Ubuntu's python3, conda, "
             "uv's Pythons, or pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared), or set AIRHOST_LIBPYTHON to a " +
             name;
    if (sc.ran && !sc.libdir.empty() && !sc.instsoname.empty()) {
      const std::string path = sc.libdir + "/" + sc.instsoname;
      if (is_file(path) && open_global(path, error)) return "";
      if (!is_file(path) && !open_global(sc.instsoname, error))
        return who + " names " + path + " as its libpython, but there is no such file: install it (Debian/Ubuntu: "
               "apt-get install libpython" + search.version + "; Fedora/RHEL: python3-libs), or set "
               "AIRHOST_LIBPYTHON to a " + name;
      if (!is_file(path)) return "";
    }
  }
  if ((search.python.empty() || error.empty()) && open_global(name, error)) return "";  // the system's library path
  std::string looked;
  for (const auto& d : search.dirs) looked += d + ", ";
  return "found no " + name + " for " + who + " (looked in " + looked + "the system's library path" +
         (error.empty() ? std::string() : "; " + error) + "). Set AIRHOST_LIBPYTHON to its path, or run airhost "
         "with a Python " + search.version + " built with --enable-shared";
}

std::vector<std::string> rank_library_candidates(const std::string& exe_dir) {
  const std::string name = "libairhost-rank-py.so";
  return {exe_dir + "/" + name, dirname_of(exe_dir) + "/lib/airhost/" + name};
}

}  // namespace airhost::rank
