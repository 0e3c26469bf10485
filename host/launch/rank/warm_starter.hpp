// warm_starter.hpp — ranks forked by a warm server instead of spawned cold.
//
// A warm server (`airhost-rank --warm-server`, runtime/warm.py) is an interpreter that has
// already started and imported the heavy modules (torch). It listens on a unix socket (0600,
// in a 0700 directory, checked to be the current user's) and forks one rank per request.
// The ranks are the server's children, so the server reports their exits.
//
// Protocol: frames of the control channel's codec (frames.hpp), payloads are fields.
//
//   host → server  HELLO     env (the rank environment, NUL-separated KEY=VALUE), and what
//                            else a cold rank would inherit from this host: umask, affinity
//                            (CPU list), rlimits (resource=soft:hard,...), nice; none of
//                            it for `warm status`
//   server → host  READY     pid, python, version, preload, modules, uptime, ranks
//                  REFUSED   reason: not safe to fork now (threads, CUDA, a denied module),
//                            an interpreter-start variable differs (PYTHONPATH...), an
//                            inherited attribute differs (umask...), or a preloaded source
//                            changed (then the server retires)
//   host → server  START     rank, argv, env, cwd, + SCM_RIGHTS: the rank's stdout, stderr
//                            and control channel (they become its fds 1, 2 and 3)
//   server → host  STARTED   rank, pid (sent once the rank leads its own session)
//                  START_FAILED rank, reason
//                  EXITED    pid, status, signal (waitpid of a rank of this connection)
//   host → server  STOP      `airhost warm stop`; STOPPING pid, ranks: it exits once they end
//
// The host closing its connection makes the server SIGKILL that connection's rank groups;
// the server closing it (it died) makes the starter fail the connection's running ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch/rank/frames.hpp"
#include "launch/rank/rank_starter.hpp"

namespace airhost::detail {

enum class WarmKind : std::uint16_t {
  hello = 1, ready, refused, start, started, start_failed, exited, stop, stopping,
};

// Why no warm server can serve a launch; what() is one sentence.
class WarmUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WarmServerInfo {
  int pid = 0;
  std::string python, version, preload, modules, uptime;
  int ranks = 0;
};

// Where a user's session server listens: $AIRHOST_STATE_DIR/warm.sock, else
// ${XDG_STATE_HOME:-~/.local/state}/airhost/warm.sock, whatever AIRHOST_RUNS_DIR says.
std::string default_warm_socket();

// Connects to the server behind `path`, after checking the socket is a socket of this user
// and not accessible to others; the peer's uid is checked too. Throws WarmUnavailable (a
// stale socket — nobody listening — says so). Returns the connected fd.
int warm_connect(const std::string& path);

// HELLO with the launch's rank environment (empty: no check); returns READY's fields.
// Throws WarmUnavailable with the server's reason when it refuses.
WarmServerInfo warm_hello(int fd, const std::vector<std::string>& rank_env);

// Sends STOP; returns the server's pid.
int warm_stop(int fd);

// A RankStarter over a connected, READY fd (owned from now on).
std::unique_ptr<RankStarter> make_warm_starter(int fd, int server_pid);

}  // namespace airhost::detail
