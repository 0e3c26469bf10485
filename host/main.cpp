// airhost — run a Python script or function on every accelerator of this node.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "gpu/accelerators.hpp"
#include "airhost/airhost.hpp"
#include "cli.hpp"
#include "cluster_env.hpp"
#include "gpu/doctor.hpp"
#include "rank_env.hpp"
#include "report_format.hpp"
#include "run_dir.hpp"
#include "tracking.hpp"
#include "util.hpp"
#include "warm_starter.hpp"

namespace {

using namespace airhost;
using namespace airhost::detail;

// SIGINT, SIGTERM and SIGHUP outside a run (while the command line is read, a preflight
// runs, the run is written down): nothing of a run is alive to forward them to, so the host
// ends as the signal would end it. It must be a handler, not SIG_DFL: as a container's PID 1
// the kernel drops a signal whose action is the default, and `docker stop` would wait for its
// SIGKILL. During a run the supervisor watches them instead, and puts this one back after.
void on_signal_outside_a_run(int sig) {
  if (::getpid() == 1) _exit(128 + sig);  // the contract's 128+signal (129 / 130 / 143)
  ::signal(sig, SIG_DFL);  // elsewhere: die of it, exactly as without a handler
  ::raise(sig);
}

void handle_signals_outside_a_run() {
  struct sigaction sa{};
  sa.sa_handler = on_signal_outside_a_run;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "airhost: %s\nRun 'airhost --help' for usage.\n", message.c_str());
  return to_int(ExitCode::usage);
}

// HostOptions (flags over file over what Slurm or Kubernetes say over defaults: see
// cluster_env.hpp) → a fully resolved LaunchSpec; `cluster` says where each value came from.
LaunchSpec make_spec(const HostOptions& opts, ClusterResolution& cluster) {
  cluster = resolve_cluster(opts.flags, opts.settings, opts.config_path, detect_cluster(current_environment_map()));
  const Settings& s = cluster.settings;
  LaunchSpec spec;
  spec.entry = opts.entry;
  spec.entry.module_target = opts.module_target;
  const auto inventory = detect_accelerators();
  spec.nprocs = s.accelerators.value_or(0) > 0 ? *s.accelerators : default_rank_count(inventory);
  try {
    spec.devices = assign_devices(inventory, spec.nprocs);
  } catch (const ConfigError& e) {
    const std::string& from = cluster.origin.at("accelerators");
    if (from == "flag" || from == "default" || from.rfind("config ", 0) == 0) throw;
    throw ConfigError(std::string(e.what()) + " (the count came from " + from + "; give -n to override it)");
  }
  if (s.timeout) spec.timeout = *s.timeout;
  if (s.grace) spec.grace = *s.grace;
  if (s.python) spec.python = *s.python;
  if (s.run_dir) spec.run_dir = *s.run_dir;
  if (s.master_addr) spec.master_addr = *s.master_addr;
  if (s.master_port) spec.master_port = *s.master_port;
  if (s.nnodes) spec.nnodes = *s.nnodes;
  if (s.node_rank) spec.node_rank = *s.node_rank;
  if (s.max_restarts) spec.max_restarts = *s.max_restarts;
  if (s.node_timeout) spec.node_timeout = *s.node_timeout;
  if (s.join_timeout) spec.join_timeout = *s.join_timeout;
  if (s.prefix) spec.output.prefix = *s.prefix;
  if (s.ranks) spec.output.ranks = *s.ranks;
  spec.env = s.env;
  // A running warm server of this user forks the ranks when it matches (AIRHOST_WARM=0 or
  // --cold: never); the launcher falls back to a cold start otherwise.
  if (s.warm.value_or(getenv_or("AIRHOST_WARM", "1") != "0")) spec.warm_socket = default_warm_socket();
  spec.warm_preload = s.preload.value_or("");
  spec.handle_signals = true;
  spec.keep_result_descriptors = true;  // save_results streams them to results/ from shared memory
  spec.reap_orphans = true;  // a child subreaper, as tini -s: nothing a rank starts escapes
  return spec;
}

// Function entries return values; the CLI keeps them as files next to run.json, each a
// plain pickle (or JSON text) that pickle.load reads, whichever way it came from the rank.
void save_results(const RunReport& report) {
  bool any = false;
  for (const auto& r : report.ranks) any |= r.result.has_value() || r.result_blob != nullptr;
  if (!any) return;
  std::string dir = report.run_dir + "/results";
  make_dirs(dir);
  for (const auto& r : report.ranks) {
    const std::string path = dir + "/rank-" + std::to_string(r.rank) + ".pkl";
    if (r.result) write_file_atomic(path, *r.result);
    else if (r.result_blob) write_file_atomic(path, [&](int fd) { r.result_blob->write_to(fd); });
  }
}

int doctor(const HostOptions& opts);
int warm(const HostOptions& opts);
int print_env(const LaunchSpec& spec, const ClusterResolution& cluster);

// --preflight: the quick checks that catch a bad node before hours are committed to it.
// Returns the problems found, one sentence each.
std::vector<std::string> preflight(const LaunchSpec& spec) {
  std::vector<std::string> problems;
  const auto inv = detect_accelerators();
  for (int d : spec.devices) {
    bool seen = false;
    for (const auto& g : inv.gpus) seen |= g.index == d;
    if (!seen) problems.push_back("GPU " + std::to_string(d) + " is not visible through NVML");
  }
  for (const auto& g : inv.gpus)
    if (g.memory_total == 0) problems.push_back("GPU " + std::to_string(g.index) + " reports no memory");
  // The GPUs themselves: CUDA, memory, an NCCL all-reduce (`airhost doctor`, shortened). In a
  // child process, so that no CUDA context stays in this one and a hung NCCL cannot hang it.
  if (!spec.devices.empty()) {
    DoctorOptions quick;
    quick.quick = true;
    const DoctorOutcome check = run_doctor_in_child(quick, 180, spec.devices);
    if (check.exit_code != 0 && check.library_missing) {
      // torch may bring its own CUDA runtime and NCCL where airhost did not look.
      for (const auto& p : check.problems)
        std::fprintf(stderr, "airhost: preflight: warning: GPU check skipped: %s\n", p.c_str());
    } else if (check.exit_code != 0) {
      for (const auto& p : check.problems) problems.push_back("GPU check: " + p);
      if (check.problems.empty()) problems.push_back("GPU check: " + check.summary);
    }
  }
  // The interpreter must start and see torch: that is what every rank will do first.
  const std::string python = spec.python.empty() ? "python3" : spec.python;
  std::string out;
  if (run_capture(shell_quote(python) + " -c 'import torch' 2>&1", out) != 0) {
    auto last = out.find_last_of('\n', out.size() >= 2 ? out.size() - 2 : 0);
    problems.push_back(python + " cannot import torch: " + (last == std::string::npos ? out : out.substr(last + 1)));
  }
  return problems;
}

int run_main(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor of a 3-day run
  handle_signals_outside_a_run();
  const int code = run_main(argc, argv);
  // As PID 1 (a container's entrypoint) this process is every orphan's parent: reap what is
  // left before leaving (the kernel ends the namespace's processes when PID 1 exits).
  if (::getpid() == 1)
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  return code;
}

namespace {

int run_main(int argc, char** argv) {

  HostOptions opts;
  try {
    opts = parse_command_line(std::vector<std::string>(argv, argv + argc), current_directory());
  } catch (const ConfigError& e) {
    return usage_error(e.what());
  }

  switch (opts.command) {
    case Command::help:
      std::fputs(usage_text().c_str(), stdout);
      return 0;
    case Command::version:
      std::printf("airhost %s\n", version());
      return 0;
    case Command::doctor:
      return doctor(opts);
    case Command::warm:
      return warm(opts);
    case Command::run:
      break;
  }

  LaunchSpec spec;
  ClusterResolution cluster;
  try {
    spec = make_spec(opts, cluster);
  } catch (const ConfigError& e) {
    return usage_error(e.what());
  }
  if (opts.print_env) return print_env(spec, cluster);

  if (spec.python.empty()) spec.python = default_python();
  try {
    Launcher(spec).check();  // refused before a preflight or an MLflow run is spent on it
  } catch (const LaunchError& e) {
    return usage_error(e.what());
  }
  if (opts.settings.preflight.value_or(false)) {
    auto problems = preflight(spec);
    for (const auto& p : problems) std::fprintf(stderr, "airhost: preflight: %s\n", p.c_str());
    if (!problems.empty()) {
      std::fprintf(stderr, "airhost: preflight failed; nothing was started (fix the node, or run without --preflight)\n");
      return to_int(ExitCode::preflight_failed);
    }
    std::fprintf(stderr, "airhost: preflight passed (%zu GPU(s), interpreter imports torch)\n", spec.devices.size());
  }

  // The MLflow run is made beside the ranks' start (tracking.hpp); the ranks learn of it
  // through a file in the run directory, which must therefore be known now.
  if (spec.run_id.empty()) spec.run_id = make_run_id();
  if (spec.run_dir.empty()) spec.run_dir = default_runs_root() + "/" + spec.run_id;
  // Flags and files win; AIRHOST_TRACKING=0 turns it off for a whole CI job or test suite.
  const bool track = opts.settings.tracking.value_or(getenv_or("AIRHOST_TRACKING", "1") != "0");
  TrackingRun tracking;
  if (track) {
    tracking = TrackingRun::start(spec.python, spec.entry.target, spec.nprocs, spec.run_dir + "/tracking.env");
    for (const auto& [k, v] : tracking.rank_env()) spec.env.try_emplace(k, v);
  }

  Callbacks callbacks;
  // Said up front when a warm server is there (used, or refused and why); a launch with no
  // server at all says "cold start" in its last line only, so output starts as it always did.
  callbacks.on_start_mode = [](bool, const std::string& line) {
    if (line.find("no warm server running") == std::string::npos) std::fprintf(stderr, "airhost: %s\n", line.c_str());
  };
  Launcher launcher(std::move(spec), std::move(callbacks));
  RunReport report;
  try {
    report = launcher.run();
  } catch (const LaunchError& e) {
    tracking.finish(Outcome::failed);
    return usage_error(e.what());
  }
  tracking.finish(report.outcome);

  try {
    save_results(report);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airhost: cannot save results: %s\n", e.what());
  }
  if (report.ok()) {
    std::fprintf(stderr, "airhost: %s in %.1f s%s (logs: %s/logs)\n", report.message.c_str(), report.wall_seconds,
                 report.warm ? ", warm start" : "", report.run_dir.c_str());
  } else {
    std::fputs(failure_summary(report).c_str(), stderr);
  }
  return report.exit_code;
}

int doctor(const HostOptions& opts) {
  const DoctorReport report = run_doctor({});
  std::fputs((opts.json ? doctor_json(report) : doctor_text(report)).c_str(), stdout);
  return report.exit_code;
}

// --print-env: where this node's place in the job came from, then what each local rank's
// environment would add to or change in this one (built by build_rank_env, as a launch does).
int print_env(const LaunchSpec& spec, const ClusterResolution& cluster) {
  if (spec.node_rank >= spec.nnodes)
    return usage_error("node_rank must be in [0, nnodes); got node_rank " + std::to_string(spec.node_rank) + " of " +
                       std::to_string(spec.nnodes) + " nodes");
  const ClusterTopology& t = cluster.topology;
  std::printf("cluster: %s\n", t.source.empty() ? "none detected (no Slurm job, no PET_NNODES, no Kubeflow PyTorchJob)"
                                                 : (t.source + " (" + t.evidence + ")").c_str());
  std::string gpus;
  for (int d : spec.devices) gpus += (gpus.empty() ? "" : ",") + std::to_string(d);
  const std::string accel = std::to_string(spec.nprocs) + (gpus.empty() ? " (CPU ranks)" : " (GPUs " + gpus + ")");
  const std::string port = spec.master_port ? std::to_string(spec.master_port) : "0 (a free port, chosen at launch)";
  const std::string default_accel = spec.devices.empty() ? "default: 1 rank, no GPU visible"
                                                         : "default: one rank per visible GPU";
  const std::vector<std::array<std::string, 3>> rows = {
      {"nnodes", std::to_string(spec.nnodes), cluster.origin.at("nnodes")},
      {"node_rank", std::to_string(spec.node_rank), cluster.origin.at("node_rank")},
      {"master_addr", spec.master_addr, cluster.origin.at("master_addr")},
      {"master_port", port, cluster.origin.at("master_port")},
      {"accelerators", accel, cluster.origin.at("accelerators") == "default" ? default_accel : cluster.origin.at("accelerators")},
  };
  std::size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row[1].size());
  for (const auto& [name, value, origin] : rows)
    std::printf("  %-13s %-*s  %s\n", name.c_str(), static_cast<int>(width), value.c_str(), origin.c_str());
  for (const auto& note : t.notes) std::printf("  note: %s\n", note.c_str());

  RunContext ctx;
  ctx.run_id = spec.run_id.empty() ? "<run id>" : spec.run_id;
  ctx.run_dir = spec.run_dir.empty() ? default_runs_root() + "/" + ctx.run_id : spec.run_dir;
  ctx.master_port = spec.master_port;
  ctx.host_pid = static_cast<int>(::getpid());
  const auto base = current_environment();
  const std::set<std::string> unchanged(base.begin(), base.end());
  for (int local = 0; local < spec.nprocs; ++local) {
    std::printf("local rank %d (global rank %d), besides this environment:\n", local,
                spec.node_rank * spec.nprocs + local);
    for (const auto& kv : build_rank_env(spec, local, ctx, base)) {
      if (unchanged.count(kv)) continue;
      std::string line = kv;
      if (kv.rfind("MASTER_PORT=", 0) == 0 && spec.master_port == 0) line = "MASTER_PORT=<a free port, chosen at launch>";
      if (kv.rfind("AIRHOST_HOST_PID=", 0) == 0) line = "AIRHOST_HOST_PID=<airhost's pid>";
      std::printf("  %s\n", line.c_str());
    }
  }
  return 0;
}

}  // namespace

namespace {

std::string rank_binary() {
  auto env = getenv_or("AIRHOST_RANK_BINARY", "");
  if (!env.empty()) return env;
  return dirname_of(executable_path()) + "/airhost-rank";
}

std::string describe(const WarmServerInfo& info, const std::string& socket) {
  return "warm server pid " + std::to_string(info.pid) + " on " + socket + ": preloaded " +
         (info.modules.empty() ? "nothing" : info.modules) + " (preload " + info.preload + "), python " +
         info.python + ", airhost " + info.version + ", up " + info.uptime + " s, " + std::to_string(info.ranks) +
         " rank(s) running";
}

// The server of `socket` if one answers; nullopt with `why` otherwise.
std::optional<WarmServerInfo> probe(const std::string& socket, std::string& why) {
  try {
    const int fd = warm_connect(socket);
    try {
      auto info = warm_hello(fd, {});
      ::close(fd);
      return info;
    } catch (...) {
      ::close(fd);
      throw;
    }
  } catch (const WarmUnavailable& e) {
    why = e.what();
    return std::nullopt;
  }
}

int warm_start(const HostOptions& opts, const std::string& socket) {
  const std::string preload = opts.settings.preload.value_or("auto");
  const std::string python = opts.settings.python.value_or(default_python());
  std::string why;
  if (auto info = probe(socket, why)) {
    std::fprintf(stderr, "airhost: a %s\n", describe(*info, socket).c_str());
    if (info->preload != preload) {
      std::fprintf(stderr, "airhost: it has preload %s, not %s; run airhost warm stop first\n", info->preload.c_str(),
                   preload.c_str());
      return 1;
    }
    return 0;
  }
  struct stat st{};
  if (::lstat(socket.c_str(), &st) == 0) {
    if (st.st_uid != ::getuid()) {
      std::fprintf(stderr, "airhost: %s belongs to uid %u, not to you; remove it by hand if it is expected\n",
                   socket.c_str(), st.st_uid);
      return 1;
    }
    ::unlink(socket.c_str());  // a stale socket of ours: its server is gone
  }
  const std::string dir = dirname_of(socket);
  make_dirs(dir);
  ::chmod(dir.c_str(), 0700);
  const std::string log = dir + "/warm.log";
  const std::string exe = rank_binary();
  std::vector<std::string> env;
  bool has_omp = false;
  for (auto& e : current_environment()) {
    if (e.rfind("PYTHONUNBUFFERED=", 0) == 0) continue;
    has_omp |= e.rfind("OMP_NUM_THREADS=", 0) == 0;
    env.push_back(e);
  }
  // What every rank gets (rank_env.cpp), so the preloaded libraries size their pools alike.
  if (!has_omp) env.push_back("OMP_NUM_THREADS=1");
  env.push_back("PYTHONUNBUFFERED=1");
  std::vector<std::string> args = {exe, "--warm-server", "--socket", socket, "--preload", preload};
  if (!python.empty()) args.insert(args.end(), {"--python", python});
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("airhost: fork");
    return 1;
  }
  if (pid == 0) {
    ::setsid();  // a session of its own: it outlives this command and the terminal's signals
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(out, 2);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execve(exe.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  const double deadline = now_seconds() + 300;
  for (;;) {
    if (auto info = probe(socket, why)) {
      std::fprintf(stderr, "airhost: started %s\n", describe(*info, socket).c_str());
      return 0;
    }
    if (why.rfind("warm server refused: ", 0) == 0) {
      // Up, but not safe to fork (a preload started a thread, say): launches will start cold.
      std::fprintf(stderr, "airhost: warm server pid %d started (log %s), but it %s; launches start cold "
                   "until it is restarted with another preload\n", static_cast<int>(pid), log.c_str(),
                   why.substr(12).c_str());
      return 0;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid || now_seconds() > deadline) {
      if (now_seconds() > deadline) ::kill(pid, SIGKILL);
      std::string text;
      run_capture("tail -n 5 " + shell_quote(log), text);
      std::fprintf(stderr, "airhost: the warm server did not start (log %s):\n%s", log.c_str(), text.c_str());
      return 1;
    }
    ::usleep(50000);
  }
}

int warm(const HostOptions& opts) {
  const std::string socket = default_warm_socket();
  if (opts.warm_action == "start") return warm_start(opts, socket);
  std::string why;
  if (opts.warm_action == "status") {
    if (auto info = probe(socket, why)) {
      std::printf("%s\n", describe(*info, socket).c_str());
      return 0;
    }
    std::printf("no usable warm server: %s\n", why.c_str());
    return 1;
  }
  try {  // stop
    const int fd = warm_connect(socket);
    const int pid = warm_stop(fd);
    ::close(fd);
    std::fprintf(stderr, "airhost: warm server %d stopping (it exits once its ranks have)\n", pid);
  } catch (const WarmUnavailable& e) {
    std::fprintf(stderr, "airhost: %s; nothing to stop\n", e.what());
  }
  return 0;
}

}  // namespace
