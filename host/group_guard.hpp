// group_guard.hpp — what the ranks started must not outlive a host that was SIGKILLed.
//
// Each rank leads its own process group, and what it starts (DataLoader workers, servers,
// subprocesses) stays in that group. The supervisor ends a rank's group when it sees the
// rank exit; when the host itself dies by SIGKILL, the kernel ends the ranks
// (PR_SET_PDEATHSIG), but nothing in the host is left to end their groups. The guard is one
// small process per run (`airhost-rank --guard`, in its own session so no terminal signal
// reaches it) that the host tells each rank's group as it starts and ends; when the host
// dies with groups still listed, the guard SIGKILLs them. The host reaps it at the end of
// the run, so it leaves no zombie behind either.
#pragma once

#include <uv.h>

#include <string>
#include <vector>

namespace airhost::detail {

class GroupGuard {
 public:
  // Starts the guard on `loop` from `executable` (airhost-rank) with environment `env`
  // ("KEY=VALUE"). Best effort: false when it could not start, and the run goes on
  // unguarded, as every run did before the guard existed.
  bool start(uv_loop_t* loop, const std::string& executable, const std::vector<std::string>& env);
  // A rank's group to end should the host die; the group is gone (the rank exited and the
  // supervisor killed what was left in it).
  void add(int pgid);
  void remove(int pgid);
  // The run is over: ends the guard and closes its handle (the loop can then finish).
  void stop();

 private:
  void send(char op, int pgid);

  uv_process_t process_{};
  int fd_ = -1;            // the host's end of the guard's stdin
  bool running_ = false;   // spawned and not yet exited (so its pid is still its own)
};

}  // namespace airhost::detail
