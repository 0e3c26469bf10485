// nvml.hpp — NVML opened for one query and closed again: the GPU inventory (accelerators.cpp)
// and the topology (topology.cpp) each open it this way. Internal to host/gpu/.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "gpu/nvidia_api.hpp"

namespace airhost::detail {

// The library to open: $AIRHOST_NVML_LIBRARY when set (the tests point it at a fake), else
// the driver's libnvidia-ml.so.1.
inline const char* nvml_library(bool* from_env = nullptr) {
  const char* env = std::getenv("AIRHOST_NVML_LIBRARY");
  const bool use_env = env && *env;
  if (from_env) *from_env = use_env;
  return use_env ? env : "libnvidia-ml.so.1";
}

// NVML's entry points (nvidia_api.hpp) and the handle they came from; shut down and closed
// at scope end.
struct Nvml : nvidia::NvmlApi {
  void* lib = nullptr;
  bool initialized = false;

  Nvml() = default;
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  // Unloading matters: tests open different libraries in one process, and a long-lived
  // Python process should not keep the driver's library mapped for one query.
  ~Nvml() {
    if (initialized && nvmlShutdown) nvmlShutdown();
    if (lib) dlclose(lib);
  }

  std::string describe(nvidia::nvmlReturn_t rc) const {
    const char* text = nvmlErrorString ? nvmlErrorString(rc) : nullptr;
    std::string out = text && *text ? text : "unknown error";
    return out + " (NVML error " + std::to_string(rc) + ")";
  }
};

}  // namespace airhost::detail
