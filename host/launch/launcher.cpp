#include "airhost/launcher.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <cerrno>
#include <system_error>

#include "airhost/airhost.hpp"
#include "launch/watch/flight_recorder.hpp"
#include "launch/link/link_auth.hpp"
#include "launch/link/link_wire.hpp"
#include "launch/link/node_link.hpp"
#include "launch/run/port.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/run/run_report.hpp"
#include "launch/run/run_dir.hpp"
#include "launch/launch_checks.hpp"
#include "launch/supervisor.hpp"
#include "launch/rank/warm_starter.hpp"
#include "base/unique_fd.hpp"
#include "base/built_for.hpp"
#include "base/util.hpp"

namespace airhost {

const char* version() noexcept { return AIRHOST_VERSION; }

namespace {

using detail::is_executable;
using detail::is_file;

// Space set aside as the run starts for the record written as it ends: logs that fill the disk
// (a rank's flood on a small file system) must not leave the run without its verdict. Freed
// right before run.json is replaced.
constexpr const char* kRecordReserve = ".run.json.reserve";
constexpr off_t kRecordReserveBytes = 256 * 1024;

void reserve_record_space(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kRecordReserve;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (::posix_fallocate(fd, 0, kRecordReserveBytes) != 0) {
    // A file system without fallocate: blocks written out hold the space as well.
    const std::string zeros(64 * 1024, '\0');
    for (off_t done = 0; done < kRecordReserveBytes && ::write(fd, zeros.data(), zeros.size()) > 0;) done += 64 * 1024;
  }
  ::close(fd);
}

// The rank executable: given, $AIRHOST_RANK_BINARY, next to the running program (the CLI in
// a venv's bin/, or python itself for the Python API: pip installs both there), or the
// install prefix's bin/ (an embedding program installed with cmake --install).
std::string find_rank_binary(const LaunchSpec& spec) {
  if (!spec.rank_binary.empty()) return spec.rank_binary;
  auto env = detail::getenv_or("AIRHOST_RANK_BINARY", "");
  if (!env.empty()) return env;
  const std::string beside = detail::dirname_of(detail::executable_path()) + "/airhost-rank";
#ifdef AIRHOST_INSTALL_BINDIR
  if (!is_executable(beside)) return std::string(AIRHOST_INSTALL_BINDIR) + "/airhost-rank";
#endif
  return beside;
}

// A result too large for shared memory is written to an unnamed file in results/ (O_TMPFILE).
// Where the filesystem has no O_TMPFILE, the rank names the file `.rank-N-PID.partial` for the
// moment between creating and unlinking it; a rank killed just then leaves one, removed here.
// results/ itself goes too when nothing else is in it (the CLI writes its rank-N.pkl after).
void sweep_results_dir(const std::string& run_dir) {
  const std::string dir = run_dir + "/results";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.starts_with(".rank-") && name.ends_with(".partial")) ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
    ::rmdir(dir.c_str());  // fails, as it should, when results are kept there
  }
}

// A starter forking from the warm server of spec.warm_socket, or null with `why` saying why
// the launch starts cold. Matching means: the same interpreter, airhost and preload, and the
// rank environment's interpreter-start variables (checked by the server).
std::unique_ptr<detail::RankStarter> warm_starter(const LaunchSpec& spec, const detail::Supervisor::Plan& plan,
                                                  std::string& line) {
  int fd = -1;
  try {
    fd = detail::warm_connect(spec.warm_socket);
    const auto info = detail::warm_hello(fd, detail::build_rank_env(spec, 0, plan.context, plan.base_env));
    auto differ = [](const char* what, const std::string& have, const std::string& want) {
      return detail::WarmUnavailable(std::string("the warm server has another ") + what + " (" + have +
                                     ", this launch wants " + want + ")");
    };
    if (info.python != spec.python) throw differ("python", info.python, spec.python);
    if (info.version != AIRHOST_VERSION) throw differ("airhost version", info.version, AIRHOST_VERSION);
    if (!spec.warm_preload.empty() && info.preload != spec.warm_preload)
      throw differ("preload", info.preload, spec.warm_preload);
    line = "warm start (server pid " + std::to_string(info.pid) + ", preloaded: " +
           (info.modules.empty() ? "nothing" : info.modules) + ")";
    return detail::make_warm_starter(fd, info.pid);
  } catch (const detail::WarmUnavailable& e) {
    if (fd >= 0) ::close(fd);
    line = std::string("cold start (") + e.what() + ")";
    return nullptr;
  }
}

}  // namespace

// The CLI sits next to python in the bin/ of the environment it was installed into (a venv,
// conda). Installed with pip --user or into /usr/local, it does not: then the python3.X on
// PATH of the version it was built for, as that is the one pip installed it with.
std::string default_python() {
  const std::string dir = detail::dirname_of(detail::executable_path());
  const std::string versioned = std::string("/python") + detail::built_python_version();
  for (const std::string& name : {std::string("/python3"), versioned})
    if (is_executable(dir + name)) return dir + name;
#ifdef AIRHOST_DEFAULT_PYTHON
  if (is_executable(AIRHOST_DEFAULT_PYTHON)) return AIRHOST_DEFAULT_PYTHON;
#endif
  const std::string path = detail::getenv_or("PATH", "");
  for (const auto& d : detail::split(path, ':')) {
    const std::string candidate = (d.empty() ? std::string(".") : d) + versioned;
    if (is_executable(candidate)) return candidate;
  }
  return "";
}

// Between two attempts of a several-node job no supervisor handles the host's signals, and the
// wait there may be long (node 0 waits up to join_timeout for a lost node to come back): while
// it lasts, SIGINT, SIGTERM and SIGHUP are noted here, so that the node withdraws and the run
// ends by the contract (128 + the signal, its record written) instead of dying of the signal.
namespace {
volatile sig_atomic_t g_signal_between_attempts = 0;
extern "C" void note_signal_between_attempts(int sig) { g_signal_between_attempts = sig; }

class SignalsBetweenAttempts {
 public:
  explicit SignalsBetweenAttempts(bool handle) : handle_(handle) {
    if (!handle_) return;
    g_signal_between_attempts = 0;
    struct sigaction sa {};
    sa.sa_handler = note_signal_between_attempts;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &previous_[i]);
  }
  ~SignalsBetweenAttempts() {
    if (!handle_) return;
    for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  int caught() const { return handle_ ? static_cast<int>(g_signal_between_attempts) : 0; }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  bool handle_;
  struct sigaction previous_[3] {};
};
}  // namespace

// What is left of the run's timeout (0: no limit), for a wait that must not outlive it.
static std::chrono::milliseconds time_left(const LaunchSpec& spec, double started) {
  if (spec.timeout.count() <= 0) return std::chrono::milliseconds(0);
  const auto used = std::chrono::milliseconds(static_cast<long long>((detail::now_seconds() - started) * 1000));
  return std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(spec.timeout) - used);
}

// Several nodes, after this node's ranks are gone: how the run ended for the job as a whole.
//  - this node's ranks succeeded: wait until every node's did (the exit barrier); a node that
//    fails or is lost meanwhile makes it node_lost;
//  - stopped because another node went (node_lost): name the most telling report of all;
//  - this node's first failure was a rank that lost a peer (gloo's "Connection closed by
//    peer"): that is another node's failure seen from here, so wait (up to node_timeout) for
//    that node's own report, and when there is one, name it instead of the cascade (the
//    wait ends early once every other node has reported or is gone).
static void settle_with_other_nodes(detail::NodeLink& link, const LaunchSpec& spec, RunReport& report, double started) {
  const std::string run = "run " + spec.run_id + ": ";
  auto lost = [&](const detail::NodeDown& down, const std::string& prefix, const std::string& suffix) {
    report.outcome = Outcome::node_lost;
    report.exit_code = to_int(ExitCode::node_lost);
    report.root_cause = -1;
    report.message = run + prefix + down.message + suffix;
  };
  if (report.outcome == Outcome::succeeded) {
    if (auto down = link.finish(time_left(spec, started)))
      lost(*down, "this node's " + std::to_string(report.ranks.size()) + " rank(s) succeeded, but ", "");
  } else if (report.outcome == Outcome::node_lost) {
    if (auto down = link.down()) lost(*down, "", "; this node's ranks were stopped");
  } else if (report.outcome == Outcome::failed) {
    const RankReport* root = nullptr;
    for (const auto& r : report.ranks)
      if (r.rank == report.root_cause) root = &r;
    // Even another node's cascade says more than ours: it names a node, and why it stopped.
    if (root && root->error && detail::is_lost_peer_error(*root->error)) {
      if (auto down = link.wait_down(std::chrono::milliseconds(spec.node_timeout)))
        lost(*down, "", "; this node's ranks failed or were stopped as a consequence");
    }
  }
}

struct Launcher::Impl {
  LaunchSpec spec;
  Callbacks callbacks;
  std::mutex mutex;  // guards supervisor, pending_cancel and pending_abort against other threads
  detail::Supervisor* supervisor = nullptr;
  int supervisor_attempt = 0;  // the attempt `supervisor` runs
  int pending_cancel = 0;
  std::string pending_abort;  // another node is gone: why (the node link's thread sets it)
  int pending_abort_attempt = 0;  // ... in which attempt: a report of the next one waits for it
  bool pending_abort_timed_out = false, pending_abort_hung = false;  // ... as a timeout or a hang (NodeDown)
  int node_lost_attempt = -1;  // the last attempt in which another node was lost (its airhost gone or silent)
  bool node_came = false;      // ... or, in an elastic job, node 0 stopped it to take nodes in
  bool ran = false;
};

Launcher::Launcher(LaunchSpec spec, Callbacks callbacks) : impl_(std::make_unique<Impl>()) {
  impl_->spec = std::move(spec);
  impl_->callbacks = std::move(callbacks);
}

Launcher::~Launcher() = default;

void Launcher::cancel(int signal) noexcept {
  std::lock_guard lock(impl_->mutex);
  // Kept also while a supervisor runs: the launcher must not restart a cancelled run.
  impl_->pending_cancel = signal ? signal : SIGINT;
  if (impl_->supervisor) impl_->supervisor->cancel(signal);
}

void Launcher::check() const {
  LaunchSpec spec = impl_->spec;
  if (spec.python.empty()) spec.python = default_python();
  detail::validate(spec, find_rank_binary(spec));
}

RunReport Launcher::run() {
  LaunchSpec& spec = impl_->spec;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->ran) throw LaunchError("a Launcher runs once; create another one for a new launch");
    impl_->ran = true;
  }
  const std::string rank_binary = find_rank_binary(spec);
  if (spec.python.empty()) spec.python = default_python();
  detail::validate(spec, rank_binary);
  detail::ensure_descriptors_for(spec.nprocs, spec.nnodes > 1 && spec.node_rank == 0 ? spec.nnodes - 1 : 0);
  // Two descriptors kept back, low in the table, for the final record: when the process's
  // open files run out (a limit lowered under it, a flood of connections), the run still ends
  // with a run.json that says why, written with these once they are let go.
  detail::UniqueFd spare_fds[2] = {detail::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)),
                                   detail::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC))};

  if (spec.run_id.empty()) spec.run_id = detail::make_run_id();
  if (spec.run_dir.empty()) spec.run_dir = default_runs_root() + "/" + spec.run_id;
  try {
    detail::create_run_dir(spec.run_dir);
  } catch (const std::system_error& e) {
    throw LaunchError(std::string(e.what()) + "; choose another with --run-dir or AIRHOST_RUNS_DIR");
  }
  // What the host itself says from here on (the join, the ranks' notes, restarts) goes to the
  // host log and, never blocking on the reader, to the caller's terminal.
  detail::HostOutput out(spec.output.forward, spec.run_dir);
  if (impl_->callbacks.on_host_line && !spec.output.forward) out.set_listener(impl_->callbacks.on_host_line);

  std::string target = spec.entry.target;
  if (spec.entry.kind == Entry::Kind::pickled && target.empty()) {
    target = spec.run_dir + "/payload.pkl";
    detail::write_file_atomic(target, spec.entry.payload);
    spec.entry.payload.clear();  // written once, read by every rank; no need to hold it twice
  }

  // The store of rank 0 serves master_port on node 0 only: the other nodes just connect there.
  // An elastic job's node 0 keeps listening on master_port for nodes that come while the job
  // runs, so its store takes a free port of its own, which the welcome tells every node.
  const bool elastic = spec.nnodes > 1 && spec.nnodes_min > 0;
  detail::PortReservation port;
  if (spec.node_rank == 0) {
    try {
      port = detail::PortReservation::reserve(elastic ? 0 : spec.master_port);
    } catch (const std::system_error& e) {
      throw LaunchError(std::string(e.what()) + (spec.nnodes > 1 ? "; pick another --master-port and give it to every node"
                                                                 : "; pick another --master-port, or 0 for a free one"));
    }
  }
  int master_port = spec.node_rank == 0 ? port.port() : spec.master_port;

  // From here on run.json says the run is on, and which process runs it: `airhost runs` shows
  // it running, `airhost logs` can follow it, and a host that dies before the end is seen as
  // such (its pid is gone) rather than running forever. Replaced as the run ends, whichever
  // way (a refused join included).
  const double started = detail::now_seconds();
  try {
    detail::write_file_atomic(spec.run_dir + "/run.json", detail::run_json_started(spec, started));
    reserve_record_space(spec.run_dir);
  } catch (const std::system_error& e) {
    throw LaunchError(std::string(e.what()) + "; choose another with --run-dir or AIRHOST_RUNS_DIR");
  }

  // Several nodes: every host joins node 0's before a rank starts, then they watch each other.
  std::unique_ptr<detail::NodeLink> link;
  if (spec.nnodes > 1) {
    detail::NodeLinkConfig config;
    config.node_rank = spec.node_rank;
    config.nnodes = spec.nnodes;
    config.nnodes_min = spec.nnodes_min;
    config.join_settle = spec.join_settle;
    config.nprocs = spec.nprocs;
    config.master_addr = spec.master_addr;
    config.master_port = elastic ? spec.master_port : master_port;
    if (elastic && spec.node_rank == 0) config.store_port = master_port;
    config.scale_up_interval = spec.scale_up_interval;
    config.node_timeout = spec.node_timeout;
    config.join_timeout = spec.join_timeout;
    config.max_restarts = spec.max_restarts;
    config.join_token = !spec.join_token.empty() ? spec.join_token : detail::getenv_or("AIRHOST_JOIN_TOKEN", "");
    if (spec.timeout.count() > 0) config.join_timeout = std::min(config.join_timeout, std::chrono::milliseconds(spec.timeout));
    config.say = [&out](const std::string& line) { out.say(line); };
    if (!spec.node_shared_file.empty()) config.shared_file = spec.run_dir + "/" + spec.node_shared_file;
    try {
      link = detail::NodeLink::join(config, [this] {
        std::lock_guard lock(impl_->mutex);
        return impl_->pending_cancel != 0;
      });
    } catch (const detail::JoinAuthError& e) {
      // No libcrypto, no random bytes: nothing was started, and no record says otherwise.
      ::unlink((spec.run_dir + "/run.json").c_str());
      throw LaunchError(e.what());
    } catch (const LaunchError&) {
      // The nodes disagree, node 0 cannot listen: a refusal (exit 2), nothing was started.
      ::unlink((spec.run_dir + "/run.json").c_str());
      throw;
    } catch (const detail::NodeJoinError& e) {
      RunReport report;
      report.outcome = Outcome::node_lost;
      report.exit_code = to_int(ExitCode::node_lost);
      report.run_id = spec.run_id;
      report.run_dir = spec.run_dir;
      report.message = "run " + spec.run_id + ": " + e.what() + "; no rank was started";
      report.wall_seconds = detail::now_seconds() - started;
      {
        std::lock_guard lock(impl_->mutex);
        if (impl_->pending_cancel) {
          report.outcome = Outcome::interrupted;
          report.interrupt_signal = impl_->pending_cancel;
          report.exit_code = exit_code_for_signal(impl_->pending_cancel);
        }
      }
      try {
        detail::write_file_atomic(spec.run_dir + "/run.json", detail::run_json(report, spec, started));
      } catch (const std::system_error&) {
      }
      return report;
    }
    // The group this node is in: an elastic job's nodes are those that came, numbered by node 0,
    // and every rank's RANK, WORLD_SIZE, GROUP_RANK and NNODES, its logs' names and its records
    // follow them.
    spec.node_rank = link->node_rank();
    spec.nnodes = link->nnodes();
    if (link->store_port() > 0) master_port = link->store_port();
    // Stacks across nodes: node 0's requests reach the supervisor of this node's attempt under
    // way; a node between two attempts has no ranks to show, and node 0 names it as silent.
    link->handle_stacks({[this](unsigned seq, const std::string& only) {
                           std::lock_guard lock(impl_->mutex);
                           if (impl_->supervisor) impl_->supervisor->stacks_asked(seq, only);
                         },
                         [this](int node, unsigned seq, const std::string& ranks) {
                           std::lock_guard lock(impl_->mutex);
                           if (impl_->supervisor) impl_->supervisor->stacks_answered(node, seq, ranks);
                         }});
    link->start([this](const detail::NodeDown& down) {
      std::lock_guard lock(impl_->mutex);
      if (down.lost || down.grow) impl_->node_lost_attempt = down.attempt, impl_->node_came = down.grow;
      if (impl_->pending_abort.empty() || impl_->pending_abort_attempt != down.attempt)
        impl_->pending_abort = down.message, impl_->pending_abort_attempt = down.attempt,
        impl_->pending_abort_timed_out = down.timed_out && !down.cascade, impl_->pending_abort_hung = down.hung;
      if (impl_->supervisor && impl_->supervisor_attempt == down.attempt)
        impl_->supervisor->abort(down.message, down.timed_out && !down.cascade, down.hung);
    });
  }

  std::vector<std::string> rank_argv = {rank_binary, "--kind", detail::entry_kind(spec.entry), "--target", target};
  if (!spec.entry.function.empty()) rank_argv.insert(rank_argv.end(), {"--function", spec.entry.function});
  if (!spec.python.empty()) rank_argv.insert(rank_argv.end(), {"--python", spec.python});
  if (spec.entry.result_format != "pickle") rank_argv.insert(rank_argv.end(), {"--result-format", spec.entry.result_format});
  rank_argv.push_back("--");
  rank_argv.insert(rank_argv.end(), spec.entry.args.begin(), spec.entry.args.end());
  const std::vector<std::string> base_env = detail::current_environment();

  // One Supervisor per attempt: a failed attempt is over (every rank reaped, every pipe
  // drained) before the next one starts, with the same run directory, port and logs.
  std::vector<std::string> failed_attempts;
  std::vector<std::string> incomplete_logs, trimmed_logs;  // of every attempt
  RunReport report;
  bool warm = !spec.warm_socket.empty();
  std::string start_mode;
  // A node that came back to a job (its airhost was lost and started again) joins the group's
  // next attempt, as every other node starts it.
  int attempt = link ? link->attempt() : 0;
  // An elastic job's restarts after a node was lost are not the ranks' fault: they do not count
  // against max_restarts (the attempt number, TORCHELASTIC_RESTART_COUNT, counts them all).
  int own_failures = 0;  // an elastic job: the attempts this node's own ranks failed
  bool elastic_restart = false;
  if (attempt > 0) {
    const std::string mark = "----- airhost: this node came back to the job; restart " + std::to_string(attempt) +
                             " of " + std::to_string(spec.max_restarts) + " -----\n";
    for (int i = 0; i < spec.nprocs; ++i) {
      const std::string log = spec.run_dir + "/logs/rank-" + std::to_string(spec.node_rank * spec.nprocs + i) + ".stderr.log";
      if (is_file(log)) detail::append_file(log, (detail::ends_line(log) ? "" : "\n") + mark);
    }
  }
  if (spec.restart_offset > 0) {
    // A requeued job: its logs go on in the same files, from a line that says so.
    const std::string mark = "----- airhost: the job was requeued; restart " + std::to_string(spec.restart_offset) +
                             " of the job -----\n";
    for (int i = 0; i < spec.nprocs; ++i) {
      const std::string log = spec.run_dir + "/logs/rank-" + std::to_string(spec.node_rank * spec.nprocs + i) + ".stderr.log";
      if (is_file(log)) detail::append_file(log, (detail::ends_line(log) ? "" : "\n") + mark);
    }
  }
  std::vector<RunReport::Attempt> attempts;
  for (;; ++attempt) {
    {
      RunReport::Attempt a;
      a.attempt = spec.restart_offset + attempt;
      a.nnodes = spec.nnodes;
      a.node_rank = spec.node_rank;
      if (link && spec.node_rank == 0) a.nodes = link->node_names();
      a.began = !failed_attempts.empty() ? failed_attempts.back()
                : attempt > 0           ? "this node came back to the job"
                : spec.restart_offset   ? "the job was requeued"
                                        : "the run started";
      attempts.push_back(std::move(a));
    }
    detail::Supervisor::Plan plan;
    plan.spec = &spec;
    plan.callbacks = &impl_->callbacks;
    plan.context = {spec.run_id, spec.run_dir, master_port, static_cast<int>(::getpid()), 3, spec.restart_offset + attempt};
    plan.out = &out;
    // The live record: each rank's pid and state as they start and exit (a full disk costs
    // the update, never the run: the final record has its space reserved).
    plan.on_ranks_changed = [&](const std::vector<RankReport>& now) {
      try {
        detail::write_file_atomic(spec.run_dir + "/run.json",
                                  detail::run_json_started(spec, started, now, spec.restart_offset + attempt, failed_attempts));
      } catch (const std::exception&) {
      }
    };
    if (link) {
      plan.on_teardown = [&link](Outcome reason, const std::string& why, bool cascade, bool hung) {
        link->tell_down(why, cascade, reason == Outcome::timed_out, hung);
      };
      plan.ask_stacks = [&link](unsigned seq, const std::vector<int>* only) {
        std::string text;
        if (only)
          for (int r : *only) text += (text.empty() ? "" : ",") + std::to_string(r);
        link->ask_stacks(seq, only && only->empty() ? "-1" : text);
      };
      plan.answer_stacks = [&link](unsigned seq, const std::vector<detail::RankStacks>& ranks) {
        link->answer_stacks(seq, detail::encode_rank_stacks(ranks, detail::kStacksAnswerCap));
      };
      plan.on_alive = [&link] { link->loop_alive(); };
      plan.alive_every = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(spec.node_timeout) / 4, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
    }
    plan.base_env = base_env;
    plan.rank_argv = rank_argv;
    plan.time_limit = time_left(spec, started);
    std::unique_ptr<detail::RankStarter> starter;
    if (warm) {
      std::string line;
      starter = warm_starter(spec, plan, line);
      if (!starter) warm = false;  // a restart starts cold too, as the first attempt did
      if (attempt == 0) {
        start_mode = line;
        if (impl_->callbacks.on_start_mode) impl_->callbacks.on_start_mode(warm, line);
      }
    }
    if (!starter) starter = detail::make_spawn_starter();
    detail::Supervisor supervisor(std::move(plan), std::move(starter));
    {
      std::lock_guard lock(impl_->mutex);
      impl_->supervisor = &supervisor;
      impl_->supervisor_attempt = attempt;
      if (impl_->pending_cancel) supervisor.cancel(impl_->pending_cancel);
      if (!impl_->pending_abort.empty() && impl_->pending_abort_attempt == attempt) supervisor.abort(impl_->pending_abort, impl_->pending_abort_timed_out, impl_->pending_abort_hung);
    }
    try {
      report = supervisor.run();
    } catch (const std::exception& e) {
      // The system refused what an attempt needs before any of its ranks started (an event
      // loop, pipes, sockets: no descriptor left, no memory): the run ends here with a record
      // that says why, and the other nodes hear of it, never by an abort. (Once ranks run,
      // every callback of the loop is guarded and nothing is thrown out of it.)
      report = RunReport{};
      report.outcome = Outcome::not_started;
      report.exit_code = to_int(ExitCode::generic_failure);
      report.run_id = spec.run_id;
      report.run_dir = spec.run_dir;
      report.message = "run " + spec.run_id + ": this node could not start " +
                       (attempt == 0 ? std::string("its ranks") : "restart " + std::to_string(attempt)) + ": " +
                       e.what() + detail::resource_hint(e);
      out.say(report.message);
    }
    incomplete_logs.insert(incomplete_logs.end(), report.incomplete_logs.begin(), report.incomplete_logs.end());
    trimmed_logs.insert(trimmed_logs.end(), report.trimmed_logs.begin(), report.trimmed_logs.end());
    if (link) link->unwatch_loop();  // the wait for the other nodes is not a stuck loop
    // Only a rank's failure is worth another try: a timeout, Ctrl-C or cancel() is the caller
    // saying stop, and so is a cancel() that arrived while this attempt ended. On several
    // nodes a node stopped because another node's rank failed (node_lost) may start again
    // too: node 0 restarts the group only when every node may.
    // An elastic job counts each node's own failures: a node whose ranks failed more than
    // max_restarts times leaves the job (the group goes on without it while MIN nodes are left),
    // and a restart for another node's sake (it failed, was lost, or nodes came) costs it nothing.
    const bool elastic_job = link && spec.nnodes_min > 0;
    if (elastic_job && report.outcome == Outcome::failed) ++own_failures;
    bool leave = false;
    auto may_restart = [&] {
      std::lock_guard lock(impl_->mutex);
      // After a scheduler's warning the job's time is nearly up: the ranks checkpointed and
      // stopped for the job to be requeued, not for another attempt here.
      const bool stop = impl_->pending_cancel || report.warning_signal;
      if (elastic_job) {
        elastic_restart = report.outcome == Outcome::node_lost && !stop;
        leave = report.outcome == Outcome::failed && own_failures > spec.max_restarts && !stop;
        return elastic_restart || (report.outcome == Outcome::failed && own_failures <= spec.max_restarts && !stop);
      }
      return (report.outcome == Outcome::failed || (link && report.outcome == Outcome::node_lost)) &&
             attempt < spec.max_restarts && !stop;
    };
    {
      std::lock_guard lock(impl_->mutex);
      impl_->supervisor = nullptr;
    }
    if (link && (spec.max_restarts > 0 || spec.nnodes_min > 0)) {
      if (report.ok()) {
        // This node's ranks succeeded: the attempt failed only if another node's did.
        auto down = link->finish(time_left(spec, started));
        if (!down) break;
        report.outcome = Outcome::node_lost;
        report.message = "run " + spec.run_id + ": " + down->message;
      }
      SignalsBetweenAttempts signals(spec.handle_signals);
      const bool want = may_restart();
      const bool again = link->after_attempt(want, time_left(spec, started), [&] {
        std::lock_guard lock(impl_->mutex);
        if (!impl_->pending_cancel && signals.caught()) impl_->pending_cancel = signals.caught();
        return impl_->pending_cancel != 0;
      }, leave);
      {
        std::lock_guard lock(impl_->mutex);
        if (!again && impl_->pending_cancel && report.outcome != Outcome::interrupted) {
          // Stopped while the nodes waited to restart: this node's ranks are all down already.
          report.outcome = Outcome::interrupted;
          report.interrupt_signal = impl_->pending_cancel;
          report.exit_code = exit_code_for_signal(impl_->pending_cancel);
          report.message = "run " + spec.run_id + ": interrupted by " + detail::signal_name(impl_->pending_cancel) +
                           " while the nodes waited to restart (" + report.message + ")";
        }
      }
      if (!again) break;
      // An elastic job may go on with fewer nodes: this node's rank and the group's size as
      // node 0 numbered them for the next attempt.
      spec.node_rank = link->node_rank();
      spec.nnodes = link->nnodes();
    } else if (!may_restart()) {
      break;
    }
    failed_attempts.push_back(report.message);
    const RestartEvent event{attempt + 1, spec.max_restarts, report.message};
    std::string line = report.message + "; restarting all " + std::to_string(spec.nprocs) + " rank(s) (restart " +
                       std::to_string(event.restart) + " of " + std::to_string(event.max_restarts) + ")";
    if (elastic_restart) {
      std::string why;
      {
        std::lock_guard lock(impl_->mutex);
        why = impl_->node_lost_attempt != attempt ? "another node's failure"
              : impl_->node_came                  ? "nodes came"
                                                  : "a node's loss";
      }
      line = report.message + "; the job goes on with " + std::to_string(spec.nnodes) + " node(s), this one node " +
             std::to_string(spec.node_rank) + ": restarting its " + std::to_string(spec.nprocs) + " rank(s) as restart " +
             std::to_string(event.restart) + " (" + why + ": not counted against --max-restarts " +
             std::to_string(spec.max_restarts) + ")";
    } else if (link && spec.nnodes_min > 0) {
      line = report.message + "; the job goes on with " + std::to_string(spec.nnodes) + " node(s), this one node " +
             std::to_string(spec.node_rank) + ": restarting its " + std::to_string(spec.nprocs) + " rank(s) as restart " +
             std::to_string(event.restart) + " (this node's failure " + std::to_string(own_failures) + " of the " +
             std::to_string(spec.max_restarts) + " --max-restarts allows)";
    }
    if (impl_->callbacks.on_restart) impl_->callbacks.on_restart(event), out.log(line);
    else out.say(line);
    // The logs go on in the same files; a line in each stderr log says where an attempt begins,
    // always on a line of its own (a rank stopped mid-line leaves its line unfinished).
    const std::string mark = "----- airhost: restart " + std::to_string(event.restart) + " of " +
                             std::to_string(event.max_restarts) + " -----\n";
    for (const auto& r : report.ranks)
      detail::append_file(r.stderr_log, (detail::ends_line(r.stderr_log) ? "" : "\n") + mark);
  }
  sweep_results_dir(spec.run_dir);
  // A run that ended badly with torch's flight recorder dumps (an NCCL timeout writes them):
  // which collective each rank reached, in a few lines of the summary.
  if (!report.ok()) {
    const std::string stacks = spec.run_dir + "/stacks";
    const std::string python = spec.python.empty() ? default_python() : spec.python;
    report.flight_recorder =
        detail::flight_recorder_summary(python, stacks, detail::kFlightRecorderPrefix, std::chrono::seconds(30));
    if (!report.flight_recorder.empty()) {
      try {
        detail::write_file_atomic(stacks + "/flight-recorder.txt", report.flight_recorder);
      } catch (const std::exception&) {
      }
      out.log(report.flight_recorder);
    }
  }
  // Results over 64 KiB came as descriptors (ResultBlob). Unless the caller reads them from
  // there itself, they become bytes in RankReport::result, as every result was before.
  if (!spec.keep_result_descriptors) {
    for (auto& r : report.ranks) {
      if (!r.result_blob) continue;
      try {
        r.result = r.result_blob->to_string();
      } catch (const std::exception& e) {
        out.say("cannot read the result of rank " + std::to_string(r.rank) + ": " + e.what());
      }
      r.result_blob.reset();
    }
  }
  if (link) settle_with_other_nodes(*link, spec, report, started);
  // A node that only followed another's failure ends after the node it follows (the failing
  // node itself, or node 0 following it), so that its exit (138) cannot make a scheduler kill
  // the failing node before that one wrote its record (srun --kill-on-bad-exit kills the step
  // at the first bad exit). The failing node follows nobody, so the chain ends with it: no
  // wait runs into its limit, which is only there for a node that hangs on its way out.
  // (A node other than node 0 waits longer, for node 0 to give up on its own wait first.)
  if (link && !report.ok())
    link->wait_followed_nodes(std::chrono::milliseconds(spec.grace) + std::chrono::seconds(link->node_rank() == 0 ? 5 : 10));
  report.restarts = spec.restart_offset + attempt;
  report.unshown_bytes = out.close();  // of every attempt
  report.warm = warm;
  report.start_mode = start_mode;
  report.failed_attempts = std::move(failed_attempts);
  report.attempts = std::move(attempts);
  report.incomplete_logs = std::move(incomplete_logs);
  report.trimmed_logs = std::move(trimmed_logs);
  report.wall_seconds = detail::now_seconds() - started;
  if (attempt > 0 && report.ok())
    report.message += " after " + std::to_string(attempt) + " restart" + (attempt > 1 ? "s" : "");
  // An elastic job whose group changed: the summary names who left or came, each time.
  for (std::size_t i = 1; i < report.attempts.size(); ++i) {
    const auto& before = report.attempts[i - 1];
    const auto& now = report.attempts[i];
    if (now.nnodes == before.nnodes) continue;
    std::string why = now.began;
    if (why.rfind("run ", 0) == 0 && why.find(": ") != std::string::npos) why = why.substr(why.find(": ") + 2);
    if (const auto cut = why.find("; "); cut != std::string::npos) why.resize(cut);
    report.message += "; nodes " + std::to_string(before.nnodes) + " -> " + std::to_string(now.nnodes) + " (" + why + ")";
  }
  if (const std::string hint = detail::no_gpu_hint(report, spec); !hint.empty()) report.message += "; " + hint;
  else if (attempt > 0 && report.outcome == Outcome::failed && attempt == spec.max_restarts)
    report.message += " (no restart left: the group was restarted " + std::to_string(attempt) +
                      " time" + (attempt > 1 ? "s" : "") + ", the most max_restarts allows)";
  if (impl_->callbacks.before_final_record) {
    try {
      impl_->callbacks.before_final_record(report);
    } catch (const std::exception& e) {
      out.say(e.what());
    }
  }
  for (auto& fd : spare_fds) fd.reset();  // theirs are the record's now
  try {
    ::unlink((spec.run_dir + "/" + kRecordReserve).c_str());  // its space is the record's now
    detail::write_file_atomic(spec.run_dir + "/run.json", detail::run_json(report, spec, started));
  } catch (const std::system_error& e) {
    out.say(e.what());  // the run itself is over; say so and go on
  }
  // Only now do the connections close (what the link still has to say is sent first): a node
  // that follows this one sees the close once this node's record is whole.
  link.reset();
  return report;
}

}  // namespace airhost
