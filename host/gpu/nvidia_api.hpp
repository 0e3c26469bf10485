// nvidia_api.hpp — the part of NVIDIA's C APIs that airhost calls, written out by hand.
//
// airhost opens NVML (accelerators.cpp), the CUDA runtime, NCCL and cuBLAS (doctor.cpp)
// with dlopen, so the same binary builds and starts where none of them exists. What it
// needs of their headers is here instead: the types, the constants, and one function
// pointer type per entry point, named after the exact symbol looked up with dlsym (the
// versioned one where the header maps a name to it: nvmlInit → nvmlInit_v2).
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

namespace airhost::detail::gpu_abi {

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

// --- The entry points: one pointer type per symbol airhost looks up ------------------------

namespace fn {
// NVML
using nvmlInit_v2 = nvmlReturn_t (*)();
using nvmlShutdown = nvmlReturn_t (*)();
using nvmlErrorString = const char* (*)(nvmlReturn_t);
using nvmlDeviceGetCount_v2 = nvmlReturn_t (*)(unsigned*);
using nvmlDeviceGetHandleByIndex_v2 = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using nvmlDeviceGetName = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using nvmlDeviceGetUUID = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using nvmlDeviceGetMemoryInfo = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using nvmlSystemGetDriverVersion = nvmlReturn_t (*)(char*, unsigned);
using nvmlSystemGetCudaDriverVersion_v2 = nvmlReturn_t (*)(int*);
using nvmlDeviceGetPciInfo_v3 = nvmlReturn_t (*)(nvmlDevice_t, nvmlPciInfo_t*);
using nvmlDeviceGetP2PStatus = nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t, int, int*);
using nvmlDeviceGetNvLinkState = nvmlReturn_t (*)(nvmlDevice_t, unsigned, int*);
using nvmlDeviceGetNvLinkRemotePciInfo_v2 = nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*);
using nvmlDeviceGetTopologyCommonAncestor = nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t, int*);

// The CUDA runtime
using cudaRuntimeGetVersion = cudaError_t (*)(int*);
using cudaDriverGetVersion = cudaError_t (*)(int*);
using cudaGetDeviceCount = cudaError_t (*)(int*);
using cudaSetDevice = cudaError_t (*)(int);
using cudaDeviceGetPCIBusId = cudaError_t (*)(char*, int, int);
using cudaMalloc = cudaError_t (*)(void**, std::size_t);
using cudaFree = cudaError_t (*)(void*);
using cudaMemset = cudaError_t (*)(void*, int, std::size_t);
using cudaMemcpy = cudaError_t (*)(void*, const void*, std::size_t, int);
using cudaStreamCreate = cudaError_t (*)(cudaStream_t*);
using cudaStreamDestroy = cudaError_t (*)(cudaStream_t);
using cudaStreamSynchronize = cudaError_t (*)(cudaStream_t);
using cudaEventCreate = cudaError_t (*)(cudaEvent_t*);
using cudaEventDestroy = cudaError_t (*)(cudaEvent_t);
using cudaEventRecord = cudaError_t (*)(cudaEvent_t, cudaStream_t);
using cudaEventSynchronize = cudaError_t (*)(cudaEvent_t);
using cudaEventElapsedTime = cudaError_t (*)(float*, cudaEvent_t, cudaEvent_t);
using cudaDeviceSynchronize = cudaError_t (*)();
using cudaGetErrorString = const char* (*)(cudaError_t);

// NCCL
using ncclGetVersion = ncclResult_t (*)(int*);
using ncclGetErrorString = const char* (*)(ncclResult_t);
using ncclGetLastError = const char* (*)(ncclComm_t);
using ncclCommInitAll = ncclResult_t (*)(ncclComm_t*, int, const int*);
using ncclCommDestroy = ncclResult_t (*)(ncclComm_t);
using ncclCommAbort = ncclResult_t (*)(ncclComm_t);
using ncclGroupStart = ncclResult_t (*)();
using ncclGroupEnd = ncclResult_t (*)();
using ncclAllReduce = ncclResult_t (*)(const void*, void*, std::size_t, int, int, ncclComm_t, cudaStream_t);

// cuBLAS
using cublasCreate_v2 = cublasStatus_t (*)(cublasHandle_t*);
using cublasDestroy_v2 = cublasStatus_t (*)(cublasHandle_t);
using cublasGetVersion_v2 = cublasStatus_t (*)(cublasHandle_t, int*);
using cublasSgemm_v2 = cublasStatus_t (*)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                                          const float*, int, const float*, float*, int);
}  // namespace fn

}  // namespace airhost::detail::gpu_abi
