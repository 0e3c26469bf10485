// nvidia_api.cpp — the lookup of NVIDIA's entry points (nvidia_api.hpp) with dlsym, one
// function per library, each made from that library's X-macro list.
#include "gpu/nvidia_api.hpp"

#include <dlfcn.h>

namespace airhost::detail::nvidia {

namespace {
enum class Need { required, optional };
}  // namespace

#define AIRHOST_NVIDIA_RESOLVE(symbol, need, R, params)                        \
  api.symbol = reinterpret_cast<fn::symbol>(::dlsym(lib, #symbol));            \
  if (!api.symbol && Need::need == Need::required && !missing) missing = #symbol;

const char* resolve(void* lib, NvmlApi& api) {
  const char* missing = nullptr;
  AIRHOST_NVML_FUNCTIONS(AIRHOST_NVIDIA_RESOLVE)
  return missing;
}

const char* resolve(void* lib, CudartApi& api) {
  const char* missing = nullptr;
  AIRHOST_CUDART_FUNCTIONS(AIRHOST_NVIDIA_RESOLVE)
  return missing;
}

const char* resolve(void* lib, NcclApi& api) {
  const char* missing = nullptr;
  AIRHOST_NCCL_FUNCTIONS(AIRHOST_NVIDIA_RESOLVE)
  return missing;
}

const char* resolve(void* lib, CublasApi& api) {
  const char* missing = nullptr;
  AIRHOST_CUBLAS_FUNCTIONS(AIRHOST_NVIDIA_RESOLVE)
  return missing;
}

#undef AIRHOST_NVIDIA_RESOLVE

}  // namespace airhost::detail::nvidia
