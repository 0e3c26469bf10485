// report_format.hpp — run.json and the human failure summary, from one RunReport.
#pragma once

#include <string>

#include "airhost/launch.hpp"
#include "airhost/report.hpp"

namespace airhost::detail {

std::string run_json(const RunReport& report, const LaunchSpec& spec);

// One line per failed rank (rank, pid, exit code or signal, first line of its exception,
// log path), then the root cause's full traceback. Empty for a successful run.
std::string failure_summary(const RunReport& report);

// "exit 3", "SIGSEGV (signal 11)", "running".
std::string describe_exit(const RankReport& r);

}  // namespace airhost::detail
