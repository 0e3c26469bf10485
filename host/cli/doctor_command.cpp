// doctor_command.cpp — `airhost doctor [--json]` (the checks themselves: gpu/doctor.hpp),
// and the usage error every command shares.
#include <cstdio>
#include <string>

#include "airhost/exit_code.hpp"
#include "cli/commands.hpp"
#include "gpu/doctor.hpp"

namespace airhost::detail {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "airhost: %s\nRun 'airhost --help' for usage.\n", message.c_str());
  return to_int(ExitCode::usage);
}

int doctor_command(const HostOptions& opts) {
  const DoctorReport report = run_doctor({});
  std::fputs((opts.json ? doctor_json(report) : doctor_text(report)).c_str(), stdout);
  return report.exit_code;
}

}  // namespace airhost::detail
