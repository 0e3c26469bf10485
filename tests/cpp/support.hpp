// support.hpp — what several doctest files need: a scratch directory and scoped variables.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <system_error>

namespace airhost_test {

// The airhost-rank the tests launch: this build's, or AIRHOST_TEST_RANK_BINARY's. The
// ThreadSanitizer run (scripts/sanitize.sh) starts build/fuzz's: a rank is not run under TSan,
// whose runtime cannot follow the task that reads a rank's stacks (base/fault_guard.cpp).
#ifdef AIRHOST_BINARY_DIR  // the suite's targets; the ABI check includes this file without it
inline std::string rank_binary() {
  const char* given = std::getenv("AIRHOST_TEST_RANK_BINARY");
  return given && *given ? given : AIRHOST_BINARY_DIR "/airhost-rank";
}
#endif

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "airhost-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to `name` (parents created) and returns the file's path.
  std::string write(const std::string& name, const std::string& text) const {
    const auto file = path_ / name;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << text;
    return file.string();
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Sets (or, with nullopt, unsets) environment variables, and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv& set(const std::string& name, std::optional<std::string> value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    apply(name, value);
    return *this;
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) apply(name, value);
  }

 private:
  static void apply(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace airhost_test
