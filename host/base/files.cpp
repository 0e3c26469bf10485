#include "base/files.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <system_error>

#include "base/unique_fd.hpp"
#include "base/util.hpp"

namespace airhost::detail {

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw std::system_error(ENOTDIR, std::generic_category(), path);
    return;
  }
  auto parent = dirname_of(path);
  if (parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0700) < 0 && errno != EEXIST)
    throw std::system_error(errno, std::generic_category(), "cannot create directory " + path);
}

void write_file_atomic(const std::string& path, const std::string& data) {
  write_file_atomic(path, [&](int fd) {
    if (!write_all(fd, data)) throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  });
}

void write_file_atomic(const std::string& path, const std::function<void(int fd)>& write) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  try {
    write(fd);
  } catch (...) {
    // A full disk, a quota: the previous file stays whole, and no half-written .tmp is left.
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
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write_all(fd, data);
  return (::close(fd) == 0) && ok;
}

bool read_to_end(int fd, std::string& out, int timeout_ms) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[65536];
  for (;;) {
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      pollfd p{fd, POLLIN, 0};
      if (left <= 0) return false;
      const int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) return false;
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

bool read_file(const std::string& path, std::string& out) {
  out.clear();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  read_to_end(fd.get(), out);
  return true;
}

}  // namespace airhost::detail
