// rank_starter.hpp — how a rank process comes into being, as a replaceable strategy.
//
// Today ranks are spawned (fork + exec of airhost-rank). A warm-start strategy that forks
// ranks from a zygote with torch already imported, or one that asks Slurm/Kubernetes for
// them, implements the same interface: the supervisor owns the pipes and only needs a pid
// per rank and one exit notification.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace airhost::detail {

struct RankStartRequest {
  int local_rank = 0;
  std::vector<std::string> argv;  // argv[0] is the executable
  std::vector<std::string> env;   // complete environment, "KEY=VALUE"
  std::string cwd;                // empty = inherit
  int stdout_fd = -1;             // child ends: become the rank's fd 1, 2 and 3
  int stderr_fd = -1;
  int control_fd = -1;
};

// Called once on the loop thread when the rank's process ends.
using ExitCallback = std::function<void(int64_t exit_status, int term_signal)>;

class RankStarter {
 public:
  virtual ~RankStarter() = default;
  // Starts the rank in its own process group (so a teardown reaches its children too) and
  // returns its pid. Throws std::system_error when it cannot.
  virtual int start(uv_loop_t* loop, const RankStartRequest& request, ExitCallback on_exit) = 0;
  // Releases the strategy's loop handles; called once, after every rank has exited.
  virtual void close() = 0;
};

std::unique_ptr<RankStarter> make_spawn_starter();

}  // namespace airhost::detail
