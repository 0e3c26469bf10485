// airhost/gpu_usage.hpp — what this node's GPUs are doing, read from NVML (the driver's
// library, opened at run time: a node without it simply has no GPU figures).
//
// The launcher reads it every few seconds during a GPU run, beside each rank's CPU and
// memory (RunReport's run directory: metrics/ranks.jsonl; the hang and timeout reports; the
// run's MLflow run). An embedding program may read it the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace airhost {

struct GpuUsage {
  struct Device {
    unsigned index = 0;             // NVML's (PCI bus order), as CUDA numbers GPUs under CUDA_DEVICE_ORDER=PCI_BUS_ID
    int util_percent = -1;          // time a kernel ran over the driver's last sample period; -1: not known
    std::uint64_t memory_used = 0;  // bytes, every process together
    std::uint64_t memory_total = 0;
  };
  struct Process {
    int pid = 0;                    // as the driver sees it (the host's PID namespace)
    unsigned device = 0;
    std::uint64_t memory = 0;       // bytes this process holds on that GPU
  };
  double taken_at = 0;              // seconds since the epoch
  std::vector<Device> devices;
  std::vector<Process> processes;   // compute processes of every GPU
};

// Reads GpuUsage on a thread of its own, never making its caller wait: a wedged driver can
// make an NVML call block for minutes, and the launcher's loop must go on watching the ranks.
class GpuUsageReader {
 public:
  GpuUsageReader();
  // Stops the reading thread; one stuck inside NVML is left to end by itself.
  ~GpuUsageReader();
  GpuUsageReader(const GpuUsageReader&) = delete;
  GpuUsageReader& operator=(const GpuUsageReader&) = delete;

  // Asks for a fresh reading (NVML is opened at the first, and kept open). Returns at once.
  void request();
  // The newest finished reading; nullopt before the first, or when NVML cannot be used.
  std::optional<GpuUsage> latest() const;
  // Why there is no reading: NVML missing or failing (empty while none is known).
  std::string error() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace airhost
