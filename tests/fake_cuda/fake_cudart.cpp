// fake_cudart.cpp — test fake: stands in for libcudart.so (NVIDIA's CUDA runtime) and the
// GPUs behind it, which this machine does not have. It is NOT NVIDIA's library and runs
// nothing on a GPU: "device memory" is host memory from malloc, copies and memsets are
// memmove and memset, streams and events do no work. Tests point airhost at it with
// AIRHOST_CUDART_LIBRARY=<path of libfake-cudart.so>, and describe the fake devices with:
//
//   AIRHOST_FAKE_CUDA_DEVICES=N
//       N fake GPUs (unset or 0: cudaGetDeviceCount fails with cudaErrorNoDevice, as the
//       real runtime does on a node without GPUs). CUDA_VISIBLE_DEVICES, when set to a list
//       of indices, selects among them as in CUDA (the first invalid entry ends the list).
//       Device d's PCI bus ID is "0000:<physical index + 1 in hex>:00.0", as the fake NVML
//       reports it.
//   AIRHOST_FAKE_CUDA_EVENT_MS=1.0
//       What cudaEventElapsedTime reports between any two recorded events (default 1 ms):
//       timings are fixed, so the tests can compute the bandwidths airhost must print.
//   AIRHOST_FAKE_CUDA_MALLOC_LIMIT_MIB=M
//       cudaMalloc of more than M MiB fails with cudaErrorMemoryAllocation.
//   AIRHOST_FAKE_CUDA_RUNTIME_VERSION=12040
//       What cudaRuntimeGetVersion reports (default 12040, CUDA 12.4); the driver version
//       is 12040 too.
//
// Only the calls airhost makes are here, with the CUDA runtime's C signatures and error
// codes. Memory calls check that "device" pointers are inside a live fake allocation, so a
// host pointer passed as a device pointer fails as it would on a GPU. The environment is
// read at each cudaGetDeviceCount, so one test process can change the fake devices.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
constexpr cudaError_t cudaErrorMemoryAllocation = 2;
constexpr cudaError_t cudaErrorNoDevice = 100;
constexpr cudaError_t cudaErrorInvalidDevice = 101;
constexpr cudaError_t cudaErrorInvalidResourceHandle = 400;

// cudaMemcpyKind
constexpr int cudaMemcpyHostToHost = 0;
constexpr int cudaMemcpyHostToDevice = 1;
constexpr int cudaMemcpyDeviceToHost = 2;
constexpr int cudaMemcpyDeviceToDevice = 3;
constexpr int cudaMemcpyDefault = 4;

struct Allocation {
  size_t size;
  int device;
};

struct FakeStream {
  int device;
};

struct FakeEvent {
  int device;
  bool recorded = false;
};

std::mutex g_mutex;
std::map<const char*, Allocation> g_allocations;  // by start address
std::vector<int> g_devices;                       // physical index of each visible device
thread_local int t_device = 0;

std::vector<int> visible_devices() {
  std::vector<int> devices;
  const char* n_text = std::getenv("AIRHOST_FAKE_CUDA_DEVICES");
  const int n = n_text ? std::atoi(n_text) : 0;
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!cvd) {
    for (int i = 0; i < n; ++i) devices.push_back(i);
    return devices;
  }
  const char* p = cvd;
  while (*p) {
    char* end = nullptr;
    long index = std::strtol(p, &end, 10);
    if (end == p || index < 0 || index >= n) break;
    devices.push_back(static_cast<int>(index));
    p = end;
    while (*p == ' ') ++p;
    if (*p != ',') break;
    ++p;
  }
  return devices;
}

// Whether [p, p + n) lies in one live allocation.
bool is_device_range(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  auto it = g_allocations.upper_bound(c);
  if (it == g_allocations.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second.size;
}

bool valid_device(int device) { return device >= 0 && device < static_cast<int>(g_devices.size()); }

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

cudaError_t copy(void* dst, const void* src, size_t count, int kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  bool ok = false;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = true; break;
    case cudaMemcpyHostToDevice: ok = is_device_range(dst, count); break;
    case cudaMemcpyDeviceToHost: ok = is_device_range(src, count); break;
    case cudaMemcpyDeviceToDevice: ok = is_device_range(dst, count) && is_device_range(src, count); break;
    case cudaMemcpyDefault: ok = true; break;
    default: ok = false;
  }
  if (!ok || (count && (!dst || !src))) return cudaErrorInvalidValue;
  if (count) std::memmove(dst, src, count);
  return cudaSuccess;
}

}  // namespace

#define FAKE_CUDART_API extern "C" __attribute__((visibility("default")))

FAKE_CUDART_API cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_devices = visible_devices();
  *count = static_cast<int>(g_devices.size());
  return g_devices.empty() ? cudaErrorNoDevice : cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return cudaErrorInvalidValue;
  *version = static_cast<int>(env_double("AIRHOST_FAKE_CUDA_RUNTIME_VERSION", 12040));
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return cudaErrorInvalidValue;
  *version = 12040;
  return cudaSuccess;
}

FAKE_CUDART_API const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unrecognized error code";
  }
}

FAKE_CUDART_API cudaError_t cudaGetLastError() { return cudaSuccess; }

FAKE_CUDART_API cudaError_t cudaSetDevice(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaGetDevice(int* device) {
  if (!device) return cudaErrorInvalidValue;
  *device = t_device;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!bus_id || length < 13) return cudaErrorInvalidValue;
  if (!valid_device(device)) return cudaErrorInvalidDevice;
  std::snprintf(bus_id, static_cast<size_t>(length), "0000:%02X:00.0", g_devices[device] + 1);
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

FAKE_CUDART_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return cudaErrorInvalidValue;
  const double limit_mib = env_double("AIRHOST_FAKE_CUDA_MALLOC_LIMIT_MIB", 81920);
  *total_bytes = static_cast<size_t>(limit_mib * 1024 * 1024);
  *free_bytes = *total_bytes;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  const double limit_mib = env_double("AIRHOST_FAKE_CUDA_MALLOC_LIMIT_MIB", -1);
  if (limit_mib >= 0 && static_cast<double>(size) > limit_mib * 1024 * 1024) {
    return cudaErrorMemoryAllocation;
  }
  void* p = std::malloc(size ? size : 1);
  if (!p) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[static_cast<const char*>(p)] = Allocation{size, t_device};
  *ptr = p;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(static_cast<const char*>(ptr));
  if (it == g_allocations.end()) return cudaErrorInvalidValue;
  g_allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!is_device_range(ptr, count)) return cudaErrorInvalidValue;
  std::memset(ptr, value, count);
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
  return copy(dst, src, count, kind);
}

FAKE_CUDART_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind,
                                            void* /*stream*/) {
  return copy(dst, src, count, kind);
}

FAKE_CUDART_API cudaError_t cudaStreamCreate(void** stream) {
  if (!stream) return cudaErrorInvalidValue;
  *stream = new FakeStream{t_device};
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaStreamDestroy(void* stream) {
  if (!stream) return cudaErrorInvalidResourceHandle;
  delete static_cast<FakeStream*>(stream);
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaStreamSynchronize(void* /*stream*/) { return cudaSuccess; }

FAKE_CUDART_API cudaError_t cudaEventCreate(void** event) {
  if (!event) return cudaErrorInvalidValue;
  *event = new FakeEvent{t_device};
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaEventDestroy(void* event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  delete static_cast<FakeEvent*>(event);
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaEventRecord(void* event, void* stream) {
  if (!event) return cudaErrorInvalidResourceHandle;
  auto* e = static_cast<FakeEvent*>(event);
  // As in CUDA, an event and the stream it is recorded on belong to the same device.
  if (stream && static_cast<FakeStream*>(stream)->device != e->device) {
    return cudaErrorInvalidResourceHandle;
  }
  e->recorded = true;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaEventSynchronize(void* event) {
  if (!event) return cudaErrorInvalidResourceHandle;
  return cudaSuccess;
}

FAKE_CUDART_API cudaError_t cudaEventElapsedTime(float* ms, void* start, void* end) {
  if (!ms) return cudaErrorInvalidValue;
  if (!start || !end || !static_cast<FakeEvent*>(start)->recorded ||
      !static_cast<FakeEvent*>(end)->recorded) {
    return cudaErrorInvalidResourceHandle;
  }
  *ms = static_cast<float>(env_double("AIRHOST_FAKE_CUDA_EVENT_MS", 1.0));
  return cudaSuccess;
}

// Each entry point airhost resolves takes the calls airhost makes (host/gpu/nvidia_api.hpp, itself
// checked against NVIDIA's headers by tests/abi/check_gpu_abi.cpp).
#include "abi_compat.hpp"
#include "gpu/nvidia_api.hpp"
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaRuntimeGetVersion);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaDriverGetVersion);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaGetDeviceCount);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaSetDevice);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaDeviceGetPCIBusId);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaMalloc);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaFree);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaMemset);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaMemcpy);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaStreamCreate);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaStreamDestroy);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaStreamSynchronize);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaEventCreate);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaEventDestroy);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaEventRecord);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaEventSynchronize);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaEventElapsedTime);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaDeviceSynchronize);
AIRHOST_CHECK_AGAINST_GPU_ABI(cudaGetErrorString);
