#include "launch/run_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <random>
#include <system_error>

#include "airhost/launch.hpp"
#include "base/unique_fd.hpp"
#include "base/util.hpp"

namespace airhost {

std::string default_runs_root() {
  if (const char* root = std::getenv("AIRHOST_RUNS_DIR"); root && *root) return root;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) return std::string(state) + "/airhost/runs";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/state/airhost/runs";
  return "/tmp/airhost-runs-" + std::to_string(::getuid());
}

}  // namespace airhost

namespace airhost::detail {

std::string make_run_id() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%06x", rd() & 0xffffff);
  return std::string(stamp) + "-" + suffix;
}

namespace {
void mkdir_p(const std::string& path) {
  if (path.empty()) return;
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw std::system_error(ENOTDIR, std::generic_category(), path);
    return;
  }
  auto parent = dirname_of(path);
  if (parent != path) mkdir_p(parent);
  if (::mkdir(path.c_str(), 0700) < 0 && errno != EEXIST)
    throw std::system_error(errno, std::generic_category(), "cannot create run directory " + path);
}
}  // namespace

void make_dirs(const std::string& path) { mkdir_p(path); }

void create_run_dir(const std::string& path) {
  mkdir_p(path);
  mkdir_p(path + "/logs");
}

void write_file_atomic(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  bool ok = write_all(fd, data);
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) ok = false, err = errno;
  if (ok && ::rename(tmp.c_str(), path.c_str()) < 0) ok = false, err = errno;
  if (!ok) {
    // A full disk, a quota: the previous file stays whole, and no half-written .tmp is left.
    ::unlink(tmp.c_str());
    throw std::system_error(err, std::generic_category(), "cannot write " + path);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  try {
    write(fd);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) < 0 || ::rename(tmp.c_str(), path.c_str()) < 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw std::system_error(err, std::generic_category(), "cannot write " + path);
  }
}

bool ends_line(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return true;
  char last = '\n';
  return ::pread(fd.get(), &last, 1, ::lseek(fd.get(), 0, SEEK_END) - 1) != 1 || last == '\n';
}

bool append_file(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = write_all(fd, data);
  return (::close(fd) == 0) && ok;
}

}  // namespace airhost::detail
