// airhost — run a Python script or function on every accelerator of this node.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "accelerators.hpp"
#include "airhost/airhost.hpp"
#include "cli.hpp"
#include "doctor.hpp"
#include "report_format.hpp"
#include "run_dir.hpp"
#include "tracking.hpp"
#include "util.hpp"
#include "warm_starter.hpp"

namespace {

using namespace airhost;
using namespace airhost::detail;

int usage_error(const std::string& message) {
  std::fprintf(stderr, "airhost: %s\nRun 'airhost --help' for usage.\n", message.c_str());
  return to_int(ExitCode::usage);
}

// HostOptions (flags over file over defaults) → a fully resolved LaunchSpec.
LaunchSpec make_spec(const HostOptions& opts) {
  const Settings& s = opts.settings;
  LaunchSpec spec;
  spec.entry = opts.entry;
  spec.entry.module_target = opts.module_target;
  const auto inventory = detect_accelerators();
  spec.nprocs = s.accelerators.value_or(0) > 0 ? *s.accelerators : default_rank_count(inventory);
  spec.devices = assign_devices(inventory, spec.nprocs);
  if (s.timeout) spec.timeout = *s.timeout;
  if (s.grace) spec.grace = *s.grace;
  if (s.python) spec.python = *s.python;
  if (s.run_dir) spec.run_dir = *s.run_dir;
  if (s.master_addr) spec.master_addr = *s.master_addr;
  if (s.master_port) spec.master_port = *s.master_port;
  if (s.max_restarts) spec.max_restarts = *s.max_restarts;
  if (s.nnodes) spec.nnodes = *s.nnodes;
  if (s.node_rank) spec.node_rank = *s.node_rank;
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
  return spec;
}

// Function entries return values; the CLI keeps them as files next to run.json.
void save_results(const RunReport& report) {
  bool any = false;
  for (const auto& r : report.ranks) any |= r.result.has_value();
  if (!any) return;
  std::string dir = report.run_dir + "/results";
  make_dirs(dir);
  for (const auto& r : report.ranks)
    if (r.result) write_file_atomic(dir + "/rank-" + std::to_string(r.rank) + ".pkl", *r.result);
}

int doctor(const HostOptions& opts);
int warm(const HostOptions& opts);

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

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor of a 3-day run

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
  try {
    spec = make_spec(opts);
  } catch (const ConfigError& e) {
    return usage_error(e.what());
  }

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

namespace {

int doctor(const HostOptions& opts) {
  const DoctorReport report = run_doctor({});
  std::fputs((opts.json ? doctor_json(report) : doctor_text(report)).c_str(), stdout);
  return report.exit_code;
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
