// preflight.cpp — `airhost --preflight`: the node checked before any rank starts.
#include <cstdio>
#include <string>
#include <vector>

#include "base/util.hpp"
#include "cli/commands.hpp"
#include "gpu/accelerators.hpp"
#include "gpu/doctor.hpp"

namespace airhost::detail {

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

}  // namespace airhost::detail
