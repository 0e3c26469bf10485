// accelerators.hpp — what GPUs this node has, through NVML loaded at run time, and which of
// them each rank gets. The accelerator type table is accelerator_types.hpp; how the GPUs
// connect is topology.hpp.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace airhost::detail {

struct GpuInfo {
  int index = 0;             // NVML index (physical order)
  std::string name;          // "NVIDIA H100 80GB HBM3"
  std::string uuid;          // "GPU-…"
  unsigned long long memory_total = 0;  // bytes
};

struct AcceleratorInventory {
  bool nvml_loaded = false;     // false: no driver / library; gpus is empty
  std::string nvml_error;       // why NVML could not be used, when it couldn't
  std::string driver_version;
  std::vector<GpuInfo> gpus;    // the GPUs this process may use, after CUDA_VISIBLE_DEVICES
  int node_gpu_count = 0;       // every GPU NVML lists, before CUDA_VISIBLE_DEVICES
};

// Loads libnvidia-ml.so.1 (or $AIRHOST_NVML_LIBRARY, which the tests point at a fake)
// with dlopen, and lists the GPUs visible under CUDA_VISIBLE_DEVICES (indices or UUIDs,
// "" or "-1" hides all). Never throws; a node without NVML is a node without GPUs.
AcceleratorInventory detect_accelerators();

// The rank count to use when the user gave none: the visible GPUs, or 1 without any.
int default_rank_count(const AcceleratorInventory& inv);

// For `requested` ranks: the NVML indices to give local ranks 0..requested-1, or an empty
// vector for CPU ranks (no GPU on the node). Throws ConfigError when more GPUs are asked
// for than are visible, naming both numbers, and when requested < 1.
std::vector<int> assign_devices(const AcceleratorInventory& inv, int requested);

}  // namespace airhost::detail
