// gpu_usage.cpp — airhost::GpuUsageReader (include/airhost/gpu_usage.hpp): NVML read on a
// thread of the reader's own.
#include "airhost/gpu_usage.hpp"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "base/util.hpp"
#include "gpu/nvml.hpp"

namespace airhost {

using namespace detail::nvidia;

struct GpuUsageReader::State {
  std::mutex m;
  std::condition_variable cv;
  bool wanted = false, stop = false, running = false;
  std::optional<GpuUsage> latest;
  std::string error;
};

namespace {

GpuUsage read_usage(detail::Nvml& nvml) {
  GpuUsage u;
  u.taken_at = detail::now_seconds();
  unsigned count = 0;
  if (nvml.nvmlDeviceGetCount_v2(&count) != NVML_SUCCESS) return u;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t handle = nullptr;
    if (nvml.nvmlDeviceGetHandleByIndex_v2(i, &handle) != NVML_SUCCESS) continue;
    GpuUsage::Device d;
    d.index = i;
    nvmlUtilization_t util{};
    if (nvml.nvmlDeviceGetUtilizationRates && nvml.nvmlDeviceGetUtilizationRates(handle, &util) == NVML_SUCCESS)
      d.util_percent = static_cast<int>(util.gpu);
    nvmlMemory_t mem{};
    if (nvml.nvmlDeviceGetMemoryInfo(handle, &mem) == NVML_SUCCESS) d.memory_used = mem.used, d.memory_total = mem.total;
    u.devices.push_back(d);
    if (!nvml.nvmlDeviceGetComputeRunningProcesses_v3) continue;
    std::vector<nvmlProcessInfo_t> infos(16);
    for (int tries = 0; tries < 4; ++tries) {
      unsigned n = static_cast<unsigned>(infos.size());
      const nvmlReturn_t rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, &n, infos.data());
      if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
        infos.resize(n + 8);  // processes came meanwhile: room for them and a few more
        continue;
      }
      if (rc == NVML_SUCCESS)
        for (unsigned k = 0; k < n && k < infos.size(); ++k)
          u.processes.push_back({static_cast<int>(infos[k].pid), i, infos[k].usedGpuMemory});
      break;
    }
  }
  return u;
}

void reading_thread(std::shared_ptr<GpuUsageReader::State> s) {
  detail::Nvml nvml;
  bool opened = false, usable = false;
  std::unique_lock lock(s->m);
  for (;;) {
    s->cv.wait(lock, [&] { return s->wanted || s->stop; });
    if (s->stop) break;
    s->wanted = false;
    lock.unlock();
    std::string why;
    std::optional<GpuUsage> reading;
    if (!opened) {
      opened = true;
      bool from_env = false;
      const char* library = detail::nvml_library(&from_env);
      why = nvml.open(library, from_env);
      usable = why.empty();
    }
    if (usable) reading = read_usage(nvml);
    lock.lock();
    if (!why.empty()) s->error = why;
    if (reading) s->latest = std::move(reading);
  }
  s->running = false;
}

}  // namespace

GpuUsageReader::GpuUsageReader() : state_(std::make_shared<State>()) {}

GpuUsageReader::~GpuUsageReader() {
  std::lock_guard lock(state_->m);
  state_->stop = true;
  state_->cv.notify_all();
}

void GpuUsageReader::request() {
  std::lock_guard lock(state_->m);
  if (!state_->running) {
    state_->running = true;
    // Every signal blocked in it, from its first instruction: the caller's loop handles them,
    // and an NVML call is never cut short by one.
    sigset_t all, previous;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &previous);
    try {
      std::thread(reading_thread, state_).detach();  // holds the state as long as it runs
    } catch (const std::system_error&) {
      state_->running = false;
      state_->error = "no thread to read NVML on";
    }
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    if (!state_->running) return;
  }
  state_->wanted = true;
  state_->cv.notify_all();
}

std::optional<GpuUsage> GpuUsageReader::latest() const {
  std::lock_guard lock(state_->m);
  return state_->latest;
}

std::string GpuUsageReader::error() const {
  std::lock_guard lock(state_->m);
  return state_->error;
}

}  // namespace airhost
