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
//
// What left the ranks' groups (a new session, a daemon) is ended too: the host tells the
// guard each such process it sees (pid and start time, host/launch/procs/proc_tree.hpp), and the guard
// also looks for every process whose environment holds the run's AIRHOST_RUN_ID. It ends
// them all, stopped first so that none forks its way out, then SIGKILLed.
//
// Protocol on the guard's stdin, one line each: "+PGID" / "-PGID" a rank's group,
// "pPID START" / "qPID" an escaped process, "x" the run is over (end nothing).
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
  // A process of the run outside the ranks' groups (start: its start time, so that a reused
  // pid is never hit); gone again.
  void add_process(int pid, unsigned long long start);
  void remove_process(int pid);
  // The guard's pid while it runs, else 0.
  int pid() const { return running_ ? process_.pid : 0; }
  // The run is over: ends the guard and closes its handle (the loop can then finish).
  void stop();

 private:
  void send(const std::string& line);

  uv_process_t process_{};
  int fd_ = -1;            // the host's end of the guard's stdin
  bool running_ = false;   // spawned and not yet exited (so its pid is still its own)
};

}  // namespace airhost::detail
