#include "launch/run/run_dir.hpp"

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
  const std::string stamp = local_time_text(static_cast<double>(std::time(nullptr)), "%Y%m%d-%H%M%S");
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%06x", rd() & 0xffffff);
  return std::string(stamp) + "-" + suffix;
}

void create_run_dir(const std::string& path) {
  make_dirs(path);
  make_dirs(path + "/logs");
}

}  // namespace airhost::detail
