// escapees.hpp — what left the ranks' process groups, found, signalled, reaped.
//
// Everything a rank starts stays in its process group unless it leaves: a new session
// (`start_new_session=True`), a daemon's fork-setsid-fork. The supervisor signals the ranks'
// groups itself; this finds the rest through /proc (proc_tree.hpp): below the ranks in the
// process tree, below the orphans this host adopted as child subreaper, and by the run's
// AIRHOST_RUN_ID in their environment. It also keeps the run's guard told about them, so
// that they end even if this host is SIGKILLed.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launch/procs/proc_tree.hpp"

namespace airhost::detail {

class GroupGuard;

class Escapees {
 public:
  // The pids of the ranks still running (each the leader of its own group): the roots of the
  // tree walk, and the groups a signal already reaches.
  using RankPids = std::function<std::set<int>()>;

  // Starts watching on `loop`. `reap`: become a child subreaper (PR_SET_CHILD_SUBREAPER, as
  // tini -s) and reap what is adopted, with a SIGCHLD watcher beside libuv's that waits only
  // for pids libuv did not spawn. A sweep once a second tells `guard` which processes left the
  // groups, and reaps what a missed SIGCHLD left.
  void start(uv_loop_t* loop, GroupGuard* guard, std::string run_id, bool reap, RankPids rank_pids);

  // A teardown signal for what left the groups (the groups have it already: a second SIGINT
  // would mean "now" to some programs).
  void signal(int sig);
  // Every process of the run outside the groups, SIGKILLed (stopped first, so none forks its
  // way out).
  void kill_all();
  // The loop is ending: closes the watcher's handles.
  void close();
  // After the loop: waits (a little) for the processes killed at the end to die, and reaps
  // them, so none is left a zombie.
  void reap_after_run();

 private:
  std::set<int> libuv_children();
  std::vector<ProcStat> adopted(const std::vector<ProcStat>& all, const std::set<int>& libuv) const;
  // The run's processes among `all`; `with_env`: with the environment scan (it reads every
  // process's environ: for the teardown and the end, not for the periodic sweep).
  RunMatch match(bool with_env, const std::vector<ProcStat>& all);
  std::vector<ProcStat> own_tree() const;
  void reap_adopted();
  void sweep();

  uv_loop_t* loop_ = nullptr;
  GroupGuard* guard_ = nullptr;
  std::string run_id_;
  RankPids rank_pids_;
  bool reaping_ = false;
  int own_sid_ = 0;
  uv_signal_t sigchld_{};
  uv_timer_t sweep_timer_{};
  bool started_ = false;
  std::map<int, std::uint64_t> reported_;  // escaped processes the guard was told about
};

}  // namespace airhost::detail
