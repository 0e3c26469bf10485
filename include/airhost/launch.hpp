// airhost/launch.hpp — what to run, on how many ranks, and how to watch it.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace airhost {

// A LaunchSpec that cannot run (bad values, missing script, missing rank binary...).
// what() is one sentence that says what was wrong and what to do.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What each rank runs. Built by the CLI from `train.py`, `train.py:main`, `-m pkg` or
// `-m pkg:main`, and by the Python API from a cloudpickled function.
struct Entry {
  enum class Kind {
    script,    // `python train.py args`: the file is __main__, sys.path[0] is its directory
    module,    // `python -m pkg.mod args`: run as __main__, sys.path[0] is the working dir
    function,  // `train.py:main` or `-m pkg.mod:main`: import, then call main() with no args;
               //   its return value comes back as the rank's result
    pickled,   // a cloudpickled (fn, args, kwargs) in `payload`: the Python API's fan-out
  };
  Kind kind = Kind::script;
  std::string target;              // script path, dotted module name, or for pickled: a payload
                                   //   file already written (then `payload` stays empty)
  std::string function;            // function name, for Kind::function
  bool module_target = false;      // Kind::function: target is a dotted module name, not a path
  std::vector<std::string> args;   // sys.argv[1:] of every rank
  std::string payload;             // Kind::pickled: bytes written once to the run dir, read by each rank
  std::string result_format = "pickle";  // function kinds: "pickle" (cloudpickle when available),
                                         //   or "json" (UTF-8 JSON text, for C++ callers)
};

// How rank output reaches the caller. The per-rank log files are always written in full,
// whatever these say.
struct OutputOptions {
  bool prefix = true;          // prepend "[rank N] " to each forwarded line
  std::set<int> ranks;         // forward only these ranks' lines; empty = all ranks
  bool forward = true;         // false: write only the log files (and call on_output)
  std::size_t max_line = 16u << 20;  // a partial line is held for its end up to this many bytes
  int terminal_columns = 0;    // the caller's terminal, where output is shown; 0 = not a terminal.
  int terminal_lines = 0;      //   Ranks get COLUMNS (less the prefix) and LINES from it (rank_env.hpp)
  std::uint64_t log_max_bytes = 0;  // bound of each rank log: its first half and its last half are
                                    // kept, the middle cut (said in the log and the report); 0 = none
};

// Everything a launch needs, fully resolved: no file is read and no default is guessed
// after this point. The CLI and the Python API both produce one.
struct LaunchSpec {
  Entry entry;
  int nprocs = 1;                         // ranks on this node (LOCAL_WORLD_SIZE)
  int node_rank = 0;                      // GROUP_RANK of this node
  int nnodes = 1;                         // nodes in the job; WORLD_SIZE = nnodes * nprocs. With
                                          // more than one, each node's host joins node 0's host at
                                          // master_addr:master_port before any rank starts (the
                                          // nodes must agree on nnodes and nprocs), and stays
                                          // linked to it: see node_timeout
  int nnodes_min = 0;                     // elastic (--nnodes MIN:MAX): the job starts with any
                                          // number of nodes from nnodes_min to nnodes (MAX), node 0
                                          // numbering them; node_rank -1: node 0 gives this node its
                                          // rank. 0: exactly nnodes nodes
  std::chrono::milliseconds join_settle{3000};  // elastic: once nnodes_min nodes joined, how long
                                          // no newcomer must come before the job starts (at once
                                          // when nnodes joined)
  std::chrono::milliseconds scale_up_interval{60000};  // elastic: a node that comes while the job
                                          // runs is taken in by a restart of the group, at most once
                                          // this often
  std::chrono::seconds node_timeout{30};  // several nodes: another node silent this long is lost,
                                          // and this node's ranks are stopped (exit 138); a node
                                          // whose airhost exits or is killed is lost at once
  std::chrono::seconds join_timeout{600}; // several nodes: how long the nodes may take to join
  std::string join_token;                 // several nodes: the job's shared secret; node 0 admits only
                                          // nodes proving they hold it (HMAC challenge, never sent).
                                          // Empty: AIRHOST_JOIN_TOKEN if set, else an open join
  std::vector<int> devices;               // the run's GPUs (CUDA_VISIBLE_DEVICES, in order); LOCAL_RANK indexes them; empty = CPU ranks
  std::string python;                     // interpreter whose environment ranks use; empty = default
  std::map<std::string, std::string> env; // extra variables for every rank, applied last
  bool inherit_env = true;                // start from the caller's environment
  std::chrono::seconds timeout{3 * 3600}; // whole-run limit, restarts included; 0 = none
  int max_restarts = 0;                   // after a rank fails, stop the group and start it again
                                          // (TORCHELASTIC_RESTART_COUNT=1, 2, ...) up to this many
                                          // times; a timeout or an interrupt is never restarted
  std::string node_shared_file;           // several nodes: a file name in the run directory that node 0's
                                          // host sends to every other node once it exists, where it is
                                          // written under the same name (the CLI's MLflow run,
                                          // tracking.env); empty: none
  int restart_offset = 0;                 // restarts of the job before this launch (a requeued Slurm
                                          // job: SLURM_RESTART_COUNT); added to TORCHELASTIC_RESTART_COUNT
                                          // and RunReport::restarts, not counted against max_restarts
  bool requeue_when_preempted = false;   // a run that stops after the scheduler's warning will be
                                          // requeued by the caller (the CLI under Slurm with --requeue):
                                          // its final run.json says "requeued", not "preempted", so no
                                          // reader takes it for ended meanwhile; a caller whose requeue
                                          // is refused writes "preempted" back
  std::chrono::milliseconds grace{10000}; // SIGTERM → SIGKILL delay on teardown
  std::chrono::milliseconds hang_timeout{30 * 60 * 1000};  // no rank making progress this long is a hang
                                          // (docs/hangs.md): a report of where each rank is; 0 = off
  bool stop_on_hang = false;              // a hang ends the run as the timeout does (exit 124)
  std::string run_id;                     // empty = generated
  std::string run_dir;                    // empty = <runs root>/<run_id>
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR given to every rank
  int master_port = 0;                    // 0 = a free port, reserved for the run's lifetime;
                                          // required with several nodes (node 0 listens there)
  std::string rank_binary;                // the rank executable; empty = found next to airhost
  std::string working_dir;                // ranks' cwd; empty = the caller's
  OutputOptions output;
  std::string warm_socket;                // a warm server's socket: fork the ranks from it
                                          // (host/launch/rank/warm_starter.hpp); falls back to a cold start
                                          // when there is none or it refuses; empty = cold
  std::string warm_preload;               // what the warm server must have preloaded, as given to
                                          // it ("auto", "torch,numpy"); empty = whatever it has
  bool keep_result_descriptors = false;  // results over 64 KiB stay in RankReport::result_blob
                                          // (shared memory, never copied by the host) instead of
                                          // being read into RankReport::result; the Python API
                                          // and the CLI set it
  bool handle_signals = false;            // tear down on SIGINT/SIGTERM/SIGHUP to this process and
                                          // forward them to the ranks (the CLI does; an embedding
                                          // program usually calls Launcher::cancel() instead)
  bool reap_orphans = false;              // make this process a child subreaper
                                          // (PR_SET_CHILD_SUBREAPER, left set) and reap the
                                          // orphans of the run it adopts, so that what a rank
                                          // leaves behind stays in reach and is never a zombie
                                          // (the CLI does; it then reaps every child not of
                                          // its own session that libuv did not spawn, so a
                                          // program that has children of its own in other
                                          // sessions should leave it off)
};

// Where a run directory goes when LaunchSpec::run_dir is empty:
// $AIRHOST_RUNS_DIR, else $XDG_STATE_HOME/airhost/runs, else ~/.local/state/airhost/runs.
std::string default_runs_root();

// The interpreter ranks use when LaunchSpec::python is empty: the python3 next to the running
// program (airhost installed in a venv's bin/), else the one airhost was built against;
// empty if neither exists (libpython then finds its own home).
std::string default_python();

}  // namespace airhost
