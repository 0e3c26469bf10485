// proc_tree.hpp — the processes of a run, as /proc shows them, and how to end them all.
//
// A rank leads its own process group, and killing that group ends what the rank started in
// it. What left the group (a `subprocess.Popen(..., start_new_session=True)`, a daemon that
// forked, called setsid() and forked again) is found here instead, in three ways:
//
//   - by descent: every process below a root (a rank, or an orphan the host adopted as child
//     subreaper) in the parent/child tree of /proc/*/stat;
//   - by environment: every process whose initial environment holds AIRHOST_RUN_ID=<run id>
//     (each rank has it, and whatever it starts inherits it unless it clears it), with what
//     is below it;
//   - by a list: pids (with their start time, so a reused pid is never hit) that the host saw
//     earlier and told the run's guard about.
//
// Used by the supervisor (teardown, the end of a run, reaping what it adopted) and by the
// run's guard in airhost-rank (after the host died by SIGKILL); so nothing in here needs
// anything but libc.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace airhost::detail {

struct ProcStat {
  int pid = 0;
  int ppid = 0;
  int pgid = 0;
  int sid = 0;
  char state = '?';      // R S D Z T ...; 'Z' is a zombie waiting for its parent's wait()
  std::uint64_t start = 0;  // start time in clock ticks since boot: (pid, start) names one process
  std::uint64_t cpu = 0;    // CPU time used so far (user + system), clock ticks
  std::uint64_t rss = 0;    // resident memory, bytes
};

// /proc/<pid>/stat, parsed; false when the process is gone (or /proc cannot say).
bool read_proc_stat(int pid, ProcStat& out);

// Every process this one can see.
std::vector<ProcStat> list_processes();

// `pids` and every process below them, read from each process's
// /proc/<pid>/task/<tid>/children: what a run's periodic look costs is its own tree, not every
// process of the machine (256 hosts on one machine each reading all of /proc every second is
// 256 x 256). Falls back to list_processes() where the kernel does not list children
// (CONFIG_PROC_CHILDREN, on in every distribution's kernel).
std::vector<ProcStat> list_tree(const std::set<int>& pids);

// True when the initial environment of `pid` (/proc/<pid>/environ) holds exactly `entry`
// ("KEY=VALUE"). False when it does not, or cannot be read (another user's, a zombie).
bool environ_has(int pid, const std::string& entry);

// Whether `pid` blocks, ignores or catches `sig` (SigBlk of its main thread, SigIgn, SigCgt of
// /proc/<pid>/status): a process
// still between fork and its own first instructions has every disposition at the default,
// and a signal whose default is to terminate would kill it. True when it cannot be read
// (gone: nothing to protect).
bool takes_signal(int pid, int sig);

// What makes up a run's processes.
struct RunMatch {
  std::set<int> roots;                     // these and all below them (pids)
  std::map<int, std::uint64_t> known;      // pid → start time: these (if still the same
                                           //   process) and all below them
  std::string env_entry;                   // "AIRHOST_RUN_ID=<id>": these and all below;
                                           //   empty = no environment scan
  std::set<int> exclude;                   // never these, nor anything below them (the host,
                                           //   the guard)
};

// The processes of the run among `all` (zombies left out: there is nothing left to end).
std::vector<ProcStat> match_run(const std::vector<ProcStat>& all, const RunMatch& match);

// Sends `sig` to every process of the run; returns how many it signalled.
int signal_run(const RunMatch& match, int sig);

// Ends every process of the run with SIGKILL, in a way that a process forking meanwhile
// cannot outrun: each one found is stopped (SIGSTOP) first, /proc is read again until no new
// one turns up, then all of them are killed. Returns the (pid, start time) of those killed.
std::map<int, std::uint64_t> kill_run(const RunMatch& match);

}  // namespace airhost::detail
