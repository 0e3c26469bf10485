// doctor.cpp — `airhost doctor` in order (doctor_parts.hpp lists the parts, one file each),
// and in a child process for --preflight.
//
// Like accelerators.cpp for NVML, nothing of CUDA is linked or needed at build time: the
// CUDA runtime, NCCL and cuBLAS are opened with dlopen (libraries.hpp), and the few
// declarations used are written out in nvidia_api.hpp (checked against NVIDIA's headers by
// tests/abi). The libraries are never closed again: the CUDA runtime and NCCL register exit
// handlers and threads that must not outlive their code.
#include "gpu/doctor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "airhost/exit_code.hpp"
#include "gpu/doctor_parts.hpp"
#include "base/util.hpp"

namespace airhost::detail {

namespace doctor {

Plan make_plan(const DoctorOptions& o) {
  Plan p;
  p.sizes = allreduce_sizes(o);
  p.warmup = o.warmup_iters > 0 ? o.warmup_iters : (o.quick ? 2 : 5);
  p.iters = o.iters > 0 ? o.iters : (o.quick ? 5 : 20);
  p.copy_iters = o.quick ? 2 : 5;
  p.gemm_iters = o.quick ? 2 : 5;
  p.gemm_n = o.gemm_n > 0 ? o.gemm_n : 4096;
  p.memory_bytes = o.memory_bytes > 0 ? o.memory_bytes : (o.quick ? std::size_t{256} << 20 : std::size_t{1} << 30);
  return p;
}

}  // namespace doctor

DoctorReport run_doctor(const DoctorOptions& options) {
  using namespace doctor;
  DoctorReport r;
  const Plan plan = make_plan(options);
  r.warmup_iters = plan.warmup;
  r.iters = plan.iters;
  r.memory_bytes = plan.memory_bytes;
  r.copy_iters = plan.copy_iters;
  r.gemm_n = plan.gemm_n;
  r.gemm_iters = plan.gemm_iters;
  bool usable = false;
  try {
    usable = check_gpus(r);
    Cudart cuda;
    std::vector<int> gpu_of_device;
    if (usable && check_cuda_runtime(r, cuda, gpu_of_device)) {
      Cublas blas;
      const bool have_blas = load_cublas(r.cublas, blas);
      if (!have_blas) r.notes.push_back("compute check skipped: " + r.cublas.error);
      for (int d = 0; d < r.cuda_device_count; ++d) {
        DoctorGpu& g = r.gpus[gpu_of_device[d]];
        check_memory(r, cuda, d, g, plan);
        if (have_blas && g.memory_ok) check_gemm(r, cuda, blas, d, g, plan);
      }
      Nccl nccl;
      if (load_nccl(r.nccl, nccl)) {
        check_allreduce(r, cuda, nccl, plan);
      } else {
        r.problems.push_back(r.nccl.error);
      }
    }
    if (!usable && !options.quick) probe_libraries_without_gpu(r);
  } catch (const std::exception& e) {
    r.problems.push_back(std::string("the doctor itself failed: ") + e.what());
    usable = usable || !r.gpus.empty();
  }
  conclude(r, usable);
  return r;
}

DoctorOutcome run_doctor_in_child(const DoctorOptions& options, double timeout_seconds,
                                  const std::vector<int>& devices) {
  DoctorOutcome outcome;
  auto failed = [&](const std::string& why) {
    outcome.exit_code = to_int(ExitCode::preflight_failed);
    outcome.summary = why;
    outcome.problems.push_back(why);
    return outcome;
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return failed(std::string("cannot start the GPU check: pipe: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return failed(std::string("cannot start the GPU check: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    int code = to_int(ExitCode::preflight_failed);
    try {
      if (!devices.empty()) {
        std::string list;
        for (int d : devices) list += (list.empty() ? "" : ",") + std::to_string(d);
        ::setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
        ::setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
      }
      const DoctorReport report = run_doctor(options);
      // library_missing \0 summary \0 text \0 problem \0 problem \0 ...
      std::string message = std::string(report.library_missing ? "1" : "0") + '\0' + report.summary + '\0' +
                            doctor_text(report) + '\0';
      for (const auto& p : report.problems) message += p + '\0';
      write_all(fds[1], message);
      code = report.exit_code;
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string data;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (timeout_seconds > 0 && left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int ready = ::poll(&p, 1, timeout_seconds > 0 ? static_cast<int>(std::min<long long>(left, 1000)) : 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return failed(doctor::format("the GPU check did not finish within %.0f s (a hung CUDA or NCCL call?); run "
                         "'airhost doctor' to see which check hangs",
                         timeout_seconds));
  }
  if (WIFSIGNALED(status)) {
    return failed("the GPU check crashed (" + signal_name(WTERMSIG(status)) +
                  "); run 'airhost doctor' to see which check crashes");
  }
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\0') {
      parts.push_back(data.substr(start, i - start));
      start = i + 1;
    }
  }
  if (parts.size() < 3) return failed("the GPU check ended without a report (exit status " +
                                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : to_int(ExitCode::preflight_failed);
  outcome.library_missing = parts[0] == "1";
  outcome.summary = parts[1];
  outcome.text = parts[2];
  outcome.problems.assign(parts.begin() + 3, parts.end());
  return outcome;
}

}  // namespace airhost::detail
