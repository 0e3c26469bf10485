// airhost — run a Python script or function on every accelerator of this node.
#include <signal.h>
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
  if (s.prefix) spec.output.prefix = *s.prefix;
  if (s.ranks) spec.output.ranks = *s.ranks;
  spec.env = s.env;
  spec.handle_signals = true;
  spec.keep_result_descriptors = true;  // save_results streams them to results/ from shared memory
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

  Launcher launcher(std::move(spec));
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
    std::fprintf(stderr, "airhost: %s in %.1f s (logs: %s/logs)\n", report.message.c_str(), report.wall_seconds,
                 report.run_dir.c_str());
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
