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

  // Loads `library`, finds every required entry point and starts NVML. "" when it can be used,
  // else why not, in a sentence (`from_env`: the library was named by AIRHOST_NVML_LIBRARY).
  std::string open(const char* library, bool from_env) {
    lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      const std::string reason = why ? why : "unknown dlopen error";
      if (from_env) return "AIRHOST_NVML_LIBRARY=" + std::string(library) + " could not be loaded: " + reason;
      if (reason.find("No such file") != std::string::npos || reason.find("cannot open shared object") != std::string::npos)
        return std::string(library) + " not found: no NVIDIA driver on this node";
      return std::string(library) + " could not be loaded: " + reason;
    }
    if (const char* missing = nvidia::resolve(lib, *this))
      return std::string(library) + " lacks " + missing + ": the NVIDIA driver is too old or the library is not NVML";
    const nvidia::nvmlReturn_t rc = nvmlInit_v2();
    if (rc != nvidia::NVML_SUCCESS)
      return "NVML did not start: " + describe(rc) + "; the NVIDIA driver may not be loaded on this node";
    initialized = true;
    return "";
  }

  std::string describe(nvidia::nvmlReturn_t rc) const {
    const char* text = nvmlErrorString ? nvmlErrorString(rc) : nullptr;
    std::string out = text && *text ? text : "unknown error";
    return out + " (NVML error " + std::to_string(rc) + ")";
  }
};

}  // namespace airhost::detail
