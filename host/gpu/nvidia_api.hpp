// nvidia_api.hpp — the part of NVIDIA's C APIs that airhost calls, written out by hand.
//
// airhost opens NVML, the CUDA runtime, NCCL and cuBLAS with dlopen, so the same binary
// builds and starts where none of them exists. What it needs of their headers is here
// instead: the types, the constants, and each library's entry points, listed once in an
// X-macro (AIRHOST_NVML_FUNCTIONS, ... below) from which come the function pointer types
// (fn::<symbol>), the tables of pointers (NvmlApi, ...), their lookup with dlsym (resolve,
// nvidia_api.cpp) and the checks against NVIDIA's headers and libraries (tests/abi).
//
// Nothing here may drift from NVIDIA's headers. tests/abi/check_gpu_abi.cpp includes this
// file and nvml.h, cuda_runtime_api.h, nccl.h and cublas_api.h together and checks with
// static_assert that each pointer type matches the header's declaration (argument by
// argument: an enum may be written as an int of its size, an opaque handle as a pointer to
// our own incomplete struct), that each symbol is the one the header binds a call to, and
// that every constant and struct layout is the same. scripts/fetch-gpu-sdk.py brings those
// headers from NVIDIA's wheels; scripts/test.sh always builds the check.
#pragma once

#include <cstddef>

namespace airhost::detail::nvidia {

// --- NVML (nvml.h) ------------------------------------------------------------------------

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;
constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;
constexpr unsigned NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32;
constexpr unsigned NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16;
constexpr unsigned NVML_NVLINK_MAX_LINKS = 36;  // links per GPU nvml.h allows for (18 on an H100)

struct nvmlMemory_t {  // nvmlMemory_st, the version nvmlDeviceGetMemoryInfo fills
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct nvmlPciInfo_t {  // nvmlPciInfo_st
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
};

constexpr int NVML_P2P_CAPS_INDEX_NVLINK = 2;  // nvmlGpuP2PCapsIndex_t
constexpr int NVML_P2P_STATUS_OK = 0;          // nvmlGpuP2PStatus_t
constexpr int NVML_FEATURE_ENABLED = 1;        // nvmlEnableState_t
// nvmlGpuTopologyLevel_t
constexpr int NVML_TOPOLOGY_INTERNAL = 0;
constexpr int NVML_TOPOLOGY_SINGLE = 10;
constexpr int NVML_TOPOLOGY_MULTIPLE = 20;
constexpr int NVML_TOPOLOGY_HOSTBRIDGE = 30;
constexpr int NVML_TOPOLOGY_NODE = 40;
constexpr int NVML_TOPOLOGY_SYSTEM = 50;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;

struct nvmlUtilization_t {  // nvmlUtilization_st: percent of the last sample period
  unsigned gpu;             // ... in which a kernel ran
  unsigned memory;          // ... in which device memory was read or written
};

struct nvmlProcessInfo_t {  // nvmlProcessInfo_v2_st, what the _v3 process lists fill
  unsigned pid;
  unsigned long long usedGpuMemory;  // bytes
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
};

// --- The CUDA runtime (cuda_runtime_api.h, driver_types.h) --------------------------------

using cudaError_t = int;
using cudaStream_t = struct CUstream_st*;
using cudaEvent_t = struct CUevent_st*;
constexpr cudaError_t cudaSuccess = 0;
// cudaMemcpyKind
constexpr int cudaMemcpyHostToDevice = 1;
constexpr int cudaMemcpyDeviceToHost = 2;
constexpr int cudaMemcpyDeviceToDevice = 3;

// --- NCCL (nccl.h) ------------------------------------------------------------------------

using ncclResult_t = int;
using ncclComm_t = struct ncclComm*;
constexpr std::size_t NCCL_UNIQUE_ID_BYTES = 128;
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
constexpr ncclResult_t ncclSuccess = 0;
constexpr int ncclFloat32 = 7;  // ncclDataType_t
constexpr int ncclSum = 0;      // ncclRedOp_t

// --- cuBLAS (cublas_api.h: the _v2 entry points cublas_v2.h maps the plain names to) -------

using cublasStatus_t = int;
using cublasHandle_t = struct cublasContext*;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_INITIALIZED = 1;
constexpr cublasStatus_t CUBLAS_STATUS_ALLOC_FAILED = 3;
constexpr cublasStatus_t CUBLAS_STATUS_INVALID_VALUE = 7;
constexpr cublasStatus_t CUBLAS_STATUS_ARCH_MISMATCH = 8;
constexpr cublasStatus_t CUBLAS_STATUS_EXECUTION_FAILED = 13;
constexpr cublasStatus_t CUBLAS_STATUS_INTERNAL_ERROR = 14;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_SUPPORTED = 15;
constexpr int CUBLAS_OP_N = 0;  // cublasOperation_t

// --- The entry points ---------------------------------------------------------------------
//
// X(symbol, need, return type, (parameter types)), once per entry point airhost calls:
// `symbol` is the exact name dlsym looks up (the versioned one where the header maps a name
// to it: nvmlInit → nvmlInit_v2), `need` says whether a library lacking it is unusable
// (required) or only loses what it is for (optional). For NVML, `need` is what the GPU
// inventory needs (accelerators.cpp); the topology calls after it are all optional.
// Adding a row is all it takes to declare, resolve and check one more entry point.

#define AIRHOST_NVML_FUNCTIONS(X)                                                                         \
  X(nvmlInit_v2, required, nvmlReturn_t, ())                                                              \
  X(nvmlShutdown, required, nvmlReturn_t, ())                                                             \
  X(nvmlErrorString, optional, const char*, (nvmlReturn_t))                                               \
  X(nvmlDeviceGetCount_v2, required, nvmlReturn_t, (unsigned*))                                           \
  X(nvmlDeviceGetHandleByIndex_v2, required, nvmlReturn_t, (unsigned, nvmlDevice_t*))                     \
  X(nvmlDeviceGetName, required, nvmlReturn_t, (nvmlDevice_t, char*, unsigned))                           \
  X(nvmlDeviceGetUUID, required, nvmlReturn_t, (nvmlDevice_t, char*, unsigned))                           \
  X(nvmlDeviceGetMemoryInfo, required, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_t*))                       \
  X(nvmlSystemGetDriverVersion, required, nvmlReturn_t, (char*, unsigned))                                \
  X(nvmlSystemGetCudaDriverVersion_v2, optional, nvmlReturn_t, (int*))                                    \
  X(nvmlDeviceGetPciInfo_v3, optional, nvmlReturn_t, (nvmlDevice_t, nvmlPciInfo_t*))                      \
  X(nvmlDeviceGetP2PStatus, optional, nvmlReturn_t, (nvmlDevice_t, nvmlDevice_t, int, int*))              \
  X(nvmlDeviceGetNvLinkState, optional, nvmlReturn_t, (nvmlDevice_t, unsigned, int*))                     \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, optional, nvmlReturn_t, (nvmlDevice_t, unsigned, nvmlPciInfo_t*)) \
  X(nvmlDeviceGetTopologyCommonAncestor, optional, nvmlReturn_t, (nvmlDevice_t, nvmlDevice_t, int*))        \
  X(nvmlDeviceGetUtilizationRates, optional, nvmlReturn_t, (nvmlDevice_t, nvmlUtilization_t*))              \
  X(nvmlDeviceGetComputeRunningProcesses_v3, optional, nvmlReturn_t, (nvmlDevice_t, unsigned*, nvmlProcessInfo_t*))

#define AIRHOST_CUDART_FUNCTIONS(X)                                                          \
  X(cudaRuntimeGetVersion, required, cudaError_t, (int*))                                    \
  X(cudaDriverGetVersion, required, cudaError_t, (int*))                                     \
  X(cudaGetDeviceCount, required, cudaError_t, (int*))                                       \
  X(cudaSetDevice, required, cudaError_t, (int))                                             \
  X(cudaDeviceGetPCIBusId, optional, cudaError_t, (char*, int, int))                         \
  X(cudaMalloc, required, cudaError_t, (void**, std::size_t))                                \
  X(cudaFree, required, cudaError_t, (void*))                                                \
  X(cudaMemset, required, cudaError_t, (void*, int, std::size_t))                            \
  X(cudaMemcpy, required, cudaError_t, (void*, const void*, std::size_t, int))               \
  X(cudaStreamCreate, required, cudaError_t, (cudaStream_t*))                                \
  X(cudaStreamDestroy, required, cudaError_t, (cudaStream_t))                                \
  X(cudaStreamSynchronize, required, cudaError_t, (cudaStream_t))                            \
  X(cudaEventCreate, required, cudaError_t, (cudaEvent_t*))                                  \
  X(cudaEventDestroy, required, cudaError_t, (cudaEvent_t))                                  \
  X(cudaEventRecord, required, cudaError_t, (cudaEvent_t, cudaStream_t))                     \
  X(cudaEventSynchronize, required, cudaError_t, (cudaEvent_t))                              \
  X(cudaEventElapsedTime, required, cudaError_t, (float*, cudaEvent_t, cudaEvent_t))         \
  X(cudaDeviceSynchronize, required, cudaError_t, ())                                        \
  X(cudaGetErrorString, required, const char*, (cudaError_t))

#define AIRHOST_NCCL_FUNCTIONS(X)                                                                            \
  X(ncclGetVersion, required, ncclResult_t, (int*))                                                          \
  X(ncclGetErrorString, required, const char*, (ncclResult_t))                                               \
  X(ncclGetLastError, optional, const char*, (ncclComm_t)) /* NCCL >= 2.13 */                                \
  X(ncclCommInitAll, required, ncclResult_t, (ncclComm_t*, int, const int*))                                 \
  X(ncclCommDestroy, required, ncclResult_t, (ncclComm_t))                                                   \
  X(ncclCommAbort, optional, ncclResult_t, (ncclComm_t)) /* after an error; else destroyed */                \
  X(ncclGroupStart, required, ncclResult_t, ())                                                              \
  X(ncclGroupEnd, required, ncclResult_t, ())                                                                \
  X(ncclAllReduce, required, ncclResult_t, (const void*, void*, std::size_t, int, int, ncclComm_t, cudaStream_t))

#define AIRHOST_CUBLAS_FUNCTIONS(X)                                                                    \
  X(cublasCreate_v2, required, cublasStatus_t, (cublasHandle_t*))                                      \
  X(cublasDestroy_v2, required, cublasStatus_t, (cublasHandle_t))                                      \
  X(cublasGetVersion_v2, optional, cublasStatus_t, (cublasHandle_t, int*))                             \
  X(cublasSgemm_v2, required, cublasStatus_t,                                                          \
    (cublasHandle_t, int, int, int, int, int, const float*, const float*, int, const float*, int,     \
     const float*, float*, int))

// fn::<symbol>: the pointer type of each entry point.
namespace fn {
#define AIRHOST_NVIDIA_POINTER_TYPE(symbol, need, R, params) using symbol = R(*) params;
AIRHOST_NVML_FUNCTIONS(AIRHOST_NVIDIA_POINTER_TYPE)
AIRHOST_CUDART_FUNCTIONS(AIRHOST_NVIDIA_POINTER_TYPE)
AIRHOST_NCCL_FUNCTIONS(AIRHOST_NVIDIA_POINTER_TYPE)
AIRHOST_CUBLAS_FUNCTIONS(AIRHOST_NVIDIA_POINTER_TYPE)
#undef AIRHOST_NVIDIA_POINTER_TYPE
}  // namespace fn

// One library's entry points, each member named after its symbol (api.cudaMalloc(...)):
// null until resolve() finds it.
#define AIRHOST_NVIDIA_MEMBER(symbol, need, R, params) fn::symbol symbol = nullptr;
struct NvmlApi {
  AIRHOST_NVML_FUNCTIONS(AIRHOST_NVIDIA_MEMBER)
};
struct CudartApi {
  AIRHOST_CUDART_FUNCTIONS(AIRHOST_NVIDIA_MEMBER)
};
struct NcclApi {
  AIRHOST_NCCL_FUNCTIONS(AIRHOST_NVIDIA_MEMBER)
};
struct CublasApi {
  AIRHOST_CUBLAS_FUNCTIONS(AIRHOST_NVIDIA_MEMBER)
};
#undef AIRHOST_NVIDIA_MEMBER

// Looks every entry point of `api` up in `lib` (a dlopen handle) with dlsym. Returns the
// first required one, in the list's order, that the library lacks; nullptr when it has them
// all. Optional ones it lacks stay null.
const char* resolve(void* lib, NvmlApi& api);
const char* resolve(void* lib, CudartApi& api);
const char* resolve(void* lib, NcclApi& api);
const char* resolve(void* lib, CublasApi& api);

}  // namespace airhost::detail::nvidia
