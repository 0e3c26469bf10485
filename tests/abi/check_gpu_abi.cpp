// check_gpu_abi.cpp — airhost's hand-written NVIDIA declarations (host/gpu/nvidia_api.hpp) against
// NVIDIA's own headers, and against NVIDIA's own CUDA runtime and NCCL libraries.
//
// Built into the doctest suite when CMake is given AIRHOST_GPU_SDK, a folder holding
// include/{nvml.h,cuda_runtime_api.h,nccl.h,cublas_api.h} and lib/{libcudart.so.13,
// libnccl.so.2}: scripts/fetch-gpu-sdk.py makes it from NVIDIA's wheels, and
// scripts/test.sh always passes it. The compile-time half fails the build with the name of
// the declaration that drifted. The run-time half loads the real libraries on this machine,
// which has no GPU and no driver: what can be called there without one is called.
//
// Our header comes first, so that its incomplete handle structs (nvmlDevice_st, ...) are
// ours, and so that its constants are read before NVIDIA's macros of the same names exist.
#include "gpu/nvidia_api.hpp"

namespace ours = airhost::detail::nvidia;

namespace {
// Ours, read before nvml.h and nccl.h define these names as macros.
constexpr unsigned our_name_size = ours::NVML_DEVICE_NAME_V2_BUFFER_SIZE;
constexpr unsigned our_uuid_size = ours::NVML_DEVICE_UUID_V2_BUFFER_SIZE;
constexpr unsigned our_driver_size = ours::NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE;
constexpr unsigned our_bus_id_size = ours::NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE;
constexpr unsigned our_bus_id_v2_size = ours::NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE;
constexpr unsigned our_max_links = ours::NVML_NVLINK_MAX_LINKS;
constexpr std::size_t our_unique_id_bytes = ours::NCCL_UNIQUE_ID_BYTES;
}  // namespace

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "abi_compat.hpp"

#define AIRHOST_STR2(x) #x
#define AIRHOST_STR(x) AIRHOST_STR2(x)

// For each row X(NAME, ...) of nvidia_api.hpp's lists: NAME's pointer type there agrees with
// the header's declaration of NAME, and a call of NAME compiled against the header binds the
// symbol NAME itself (no macro renames it to a newer version that airhost's dlsym would not
// look up).
#define CHECK_ENTRY(name, need, R, params)                                                                      \
  static_assert(airhost::test::same_function_abi<ours::fn::name, decltype(&::name)>::value,                   \
                "nvidia_api.hpp declares " #name " differently from NVIDIA's header");                         \
  static_assert(std::string_view(AIRHOST_STR(name)) == #name,                                                  \
                "NVIDIA's header maps " #name " to another symbol; look that one up instead");

// The CUDA runtime, checked while cuda_runtime_api.h, its C API, is the only CUDA header
// here: nccl.h includes cuda_runtime.h, whose C++ overloads (template cudaMalloc(T**, ...),
// cudaEventCreate(cudaEvent_t*, unsigned)) would make &::cudaMalloc ambiguous.
#include <cuda_runtime_api.h>
AIRHOST_CUDART_FUNCTIONS(CHECK_ENTRY)

#include <cublas_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <nvml.h>

#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

#include "gpu/doctor.hpp"
#include "support.hpp"

namespace {

AIRHOST_NVML_FUNCTIONS(CHECK_ENTRY)
// The names programs write map to the versioned symbols airhost looks up.
static_assert(std::string_view(AIRHOST_STR(nvmlInit)) == "nvmlInit_v2");
static_assert(std::string_view(AIRHOST_STR(nvmlDeviceGetCount)) == "nvmlDeviceGetCount_v2");
static_assert(std::string_view(AIRHOST_STR(nvmlDeviceGetHandleByIndex)) == "nvmlDeviceGetHandleByIndex_v2");
static_assert(std::string_view(AIRHOST_STR(nvmlDeviceGetPciInfo)) == "nvmlDeviceGetPciInfo_v3");
static_assert(std::string_view(AIRHOST_STR(nvmlDeviceGetNvLinkRemotePciInfo)) == "nvmlDeviceGetNvLinkRemotePciInfo_v2");
static_assert(std::string_view(AIRHOST_STR(nvmlDeviceGetComputeRunningProcesses)) == "nvmlDeviceGetComputeRunningProcesses_v3");

AIRHOST_NCCL_FUNCTIONS(CHECK_ENTRY)
AIRHOST_CUBLAS_FUNCTIONS(CHECK_ENTRY)

// --- Types, constants and struct layouts --------------------------------------------------

static_assert(sizeof(ours::nvmlReturn_t) == sizeof(::nvmlReturn_t));
static_assert(sizeof(ours::cudaError_t) == sizeof(::cudaError_t));
static_assert(sizeof(ours::ncclResult_t) == sizeof(::ncclResult_t));
static_assert(sizeof(ours::cublasStatus_t) == sizeof(::cublasStatus_t));

static_assert(ours::NVML_SUCCESS == ::NVML_SUCCESS);
static_assert(our_name_size == NVML_DEVICE_NAME_V2_BUFFER_SIZE);
static_assert(our_uuid_size == NVML_DEVICE_UUID_V2_BUFFER_SIZE);
static_assert(our_driver_size == NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE);
static_assert(our_bus_id_size == NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE);
static_assert(our_bus_id_v2_size == NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE);
// airhost asks each of links 0..MAX-1: a header with more links means newer GPUs to cover.
static_assert(our_max_links == NVML_NVLINK_MAX_LINKS);
static_assert(ours::NVML_P2P_CAPS_INDEX_NVLINK == ::NVML_P2P_CAPS_INDEX_NVLINK);
static_assert(ours::NVML_P2P_STATUS_OK == ::NVML_P2P_STATUS_OK);
static_assert(ours::NVML_FEATURE_ENABLED == ::NVML_FEATURE_ENABLED);
static_assert(ours::NVML_TOPOLOGY_INTERNAL == ::NVML_TOPOLOGY_INTERNAL);
static_assert(ours::NVML_TOPOLOGY_SINGLE == ::NVML_TOPOLOGY_SINGLE);
static_assert(ours::NVML_TOPOLOGY_MULTIPLE == ::NVML_TOPOLOGY_MULTIPLE);
static_assert(ours::NVML_TOPOLOGY_HOSTBRIDGE == ::NVML_TOPOLOGY_HOSTBRIDGE);
static_assert(ours::NVML_TOPOLOGY_NODE == ::NVML_TOPOLOGY_NODE);
static_assert(ours::NVML_TOPOLOGY_SYSTEM == ::NVML_TOPOLOGY_SYSTEM);

#define CHECK_FIELD(ours_t, theirs_t, field)                                                   \
  static_assert(offsetof(ours_t, field) == offsetof(theirs_t, field) &&                         \
                    sizeof(ours_t::field) == sizeof(theirs_t::field),                          \
                #ours_t "::" #field " is not where NVIDIA's header puts it")
static_assert(sizeof(ours::nvmlMemory_t) == sizeof(::nvmlMemory_t));
CHECK_FIELD(ours::nvmlMemory_t, ::nvmlMemory_t, total);
CHECK_FIELD(ours::nvmlMemory_t, ::nvmlMemory_t, free);
CHECK_FIELD(ours::nvmlMemory_t, ::nvmlMemory_t, used);
static_assert(sizeof(ours::nvmlPciInfo_t) == sizeof(::nvmlPciInfo_t));
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, busIdLegacy);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, domain);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, bus);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, device);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, pciDeviceId);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, pciSubSystemId);
CHECK_FIELD(ours::nvmlPciInfo_t, ::nvmlPciInfo_t, busId);
static_assert(ours::NVML_ERROR_INSUFFICIENT_SIZE == ::NVML_ERROR_INSUFFICIENT_SIZE);
static_assert(sizeof(ours::nvmlUtilization_t) == sizeof(::nvmlUtilization_t));
CHECK_FIELD(ours::nvmlUtilization_t, ::nvmlUtilization_t, gpu);
CHECK_FIELD(ours::nvmlUtilization_t, ::nvmlUtilization_t, memory);
static_assert(sizeof(ours::nvmlProcessInfo_t) == sizeof(::nvmlProcessInfo_t));
CHECK_FIELD(ours::nvmlProcessInfo_t, ::nvmlProcessInfo_t, pid);
CHECK_FIELD(ours::nvmlProcessInfo_t, ::nvmlProcessInfo_t, usedGpuMemory);
CHECK_FIELD(ours::nvmlProcessInfo_t, ::nvmlProcessInfo_t, gpuInstanceId);
CHECK_FIELD(ours::nvmlProcessInfo_t, ::nvmlProcessInfo_t, computeInstanceId);

static_assert(ours::cudaSuccess == ::cudaSuccess);
static_assert(ours::cudaMemcpyHostToDevice == ::cudaMemcpyHostToDevice);
static_assert(ours::cudaMemcpyDeviceToHost == ::cudaMemcpyDeviceToHost);
static_assert(ours::cudaMemcpyDeviceToDevice == ::cudaMemcpyDeviceToDevice);

static_assert(ours::ncclSuccess == ::ncclSuccess);
static_assert(ours::ncclFloat32 == ::ncclFloat32);
static_assert(ours::ncclSum == ::ncclSum);
static_assert(our_unique_id_bytes == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(ours::ncclUniqueId) == sizeof(::ncclUniqueId));

static_assert(ours::CUBLAS_STATUS_SUCCESS == ::CUBLAS_STATUS_SUCCESS);
static_assert(ours::CUBLAS_STATUS_NOT_INITIALIZED == ::CUBLAS_STATUS_NOT_INITIALIZED);
static_assert(ours::CUBLAS_STATUS_ALLOC_FAILED == ::CUBLAS_STATUS_ALLOC_FAILED);
static_assert(ours::CUBLAS_STATUS_INVALID_VALUE == ::CUBLAS_STATUS_INVALID_VALUE);
static_assert(ours::CUBLAS_STATUS_ARCH_MISMATCH == ::CUBLAS_STATUS_ARCH_MISMATCH);
static_assert(ours::CUBLAS_STATUS_EXECUTION_FAILED == ::CUBLAS_STATUS_EXECUTION_FAILED);
static_assert(ours::CUBLAS_STATUS_INTERNAL_ERROR == ::CUBLAS_STATUS_INTERNAL_ERROR);
static_assert(ours::CUBLAS_STATUS_NOT_SUPPORTED == ::CUBLAS_STATUS_NOT_SUPPORTED);
static_assert(ours::CUBLAS_OP_N == ::CUBLAS_OP_N);

// --- The real libraries, loaded here (no GPU, no driver) ----------------------------------

std::string sdk_lib(const char* name) { return std::string(AIRHOST_GPU_SDK_DIR) + "/lib/" + name; }

// "NAME", for each row X(NAME, ...) of a list: every entry point, optional ones included.
#define SYMBOL_NAME(name, ...) #name,

template <typename Fn>
Fn symbol(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

// NVIDIA's wheels hold x86_64 Linux libraries: elsewhere only the compile-time half runs.
#if defined(__x86_64__) && defined(__linux__)
constexpr bool kCannotLoadTheWheelsLibraries = false;
#else
constexpr bool kCannotLoadTheWheelsLibraries = true;
#endif

}  // namespace

TEST_CASE("gpu abi: NVIDIA's CUDA runtime exports every entry point airhost resolves, and works without a GPU" * doctest::skip(kCannotLoadTheWheelsLibraries)) {
  void* lib = dlopen(sdk_lib("libcudart.so.13").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(lib != nullptr, dlerror());
  for (const char* name : {AIRHOST_CUDART_FUNCTIONS(SYMBOL_NAME)}) CHECK_MESSAGE(dlsym(lib, name) != nullptr, name);
  ours::CudartApi api;
  CHECK(ours::resolve(lib, api) == nullptr);
  int version = 0;
  REQUIRE(symbol<ours::fn::cudaRuntimeGetVersion>(lib, "cudaRuntimeGetVersion")(&version) == ours::cudaSuccess);
  CHECK(version / 1000 == CUDART_VERSION / 1000);  // the library matches the headers checked above
  // No driver here: the runtime must say so through the declared signature, not crash.
  int count = -1;
  const ours::cudaError_t rc = symbol<ours::fn::cudaGetDeviceCount>(lib, "cudaGetDeviceCount")(&count);
  CHECK(rc != ours::cudaSuccess);
  const char* text = symbol<ours::fn::cudaGetErrorString>(lib, "cudaGetErrorString")(rc);
  REQUIRE(text != nullptr);
  CHECK(std::string(text).size() > 5);
  MESSAGE("libcudart " << version << " without a driver: cudaGetDeviceCount = " << rc << " (" << std::string(text) << ")");
}

TEST_CASE("gpu abi: NVIDIA's NCCL exports every entry point airhost resolves, and reports its version" * doctest::skip(kCannotLoadTheWheelsLibraries)) {
  void* lib = dlopen(sdk_lib("libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(lib != nullptr, dlerror());
  for (const char* name : {AIRHOST_NCCL_FUNCTIONS(SYMBOL_NAME)}) CHECK_MESSAGE(dlsym(lib, name) != nullptr, name);
  ours::NcclApi api;
  CHECK(ours::resolve(lib, api) == nullptr);
  int version = 0;
  REQUIRE(symbol<ours::fn::ncclGetVersion>(lib, "ncclGetVersion")(&version) == ours::ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  const char* text = symbol<ours::fn::ncclGetErrorString>(lib, "ncclGetErrorString")(::ncclInvalidArgument);
  REQUIRE(text != nullptr);
  CHECK(std::string(text).find("argument") != std::string::npos);
}

TEST_CASE("gpu abi: the doctor on this GPU-less machine reports NVIDIA's real CUDA runtime and NCCL" * doctest::skip(kCannotLoadTheWheelsLibraries)) {
  airhost_test::ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", "/nonexistent/airhost-test/libnvidia-ml.so.1")
      .set("AIRHOST_CUDART_LIBRARY", sdk_lib("libcudart.so.13"))
      .set("AIRHOST_NCCL_LIBRARY", sdk_lib("libnccl.so.2"))
      .set("AIRHOST_CUBLAS_LIBRARY", "/nonexistent/airhost-test/libcublas.so.13")
      .set("CUDA_VISIBLE_DEVICES", std::nullopt);
  const airhost::detail::DoctorReport r = airhost::detail::run_doctor({});
  CHECK(r.exit_code == 3);
  CHECK(r.problems.empty());
  REQUIRE_MESSAGE(r.cudart.loaded, r.cudart.error);
  CHECK(r.cudart.path == sdk_lib("libcudart.so.13"));
  // cuda_runtime_api.h's CUDART_VERSION is 13050 for 13.5: the doctor asked the library.
  CHECK(r.cudart.version == std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10));
  // Without a driver the real runtime fails the count; the doctor passes on its words.
  CHECK(r.cuda_device_count == 0);
  CHECK(r.cuda_device_error.rfind("cudaGetDeviceCount: ", 0) == 0);
  CHECK(r.cuda_device_error.find("(CUDA error ") != std::string::npos);
  REQUIRE_MESSAGE(r.nccl.loaded, r.nccl.error);
  CHECK(r.nccl.version == std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
  CHECK_FALSE(r.cublas.loaded);
  const std::string text = airhost::detail::doctor_text(r);
  CHECK(text.find("CUDA runtime: " + r.cudart.version + " (" + r.cudart.path + "); cudaGetDeviceCount: ") != std::string::npos);
  CHECK(text.find("NCCL:         " + r.nccl.version + " (" + r.nccl.path + ")") != std::string::npos);
  CHECK(text.find("docker run --gpus all") != std::string::npos);
  const std::string json = airhost::detail::doctor_json(r);
  CHECK(json.find("\"nccl\": {\"loaded\": true") != std::string::npos);
  MESSAGE(text);
}

TEST_CASE("gpu abi: NVIDIA's real NCCL failing to start is reported in its own words, and nothing hangs" * doctest::skip(kCannotLoadTheWheelsLibraries)) {
  // The GPUs, the CUDA runtime and cuBLAS here are FAKES (tests/fake_nvml, tests/fake_cuda:
  // this machine has no GPU); NCCL is NVIDIA's. It needs a driver, finds none, and
  // ncclCommInitAll fails: the doctor must report that through ncclGetErrorString and
  // ncclGetLastError, as on a node whose driver is broken, and return.
  airhost_test::ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", AIRHOST_FAKE_NVML_PATH)
      .set("AIRHOST_FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3:81559:GPU-1000;NVIDIA H100 80GB HBM3:81559:GPU-1001")
      .set("AIRHOST_FAKE_NVML_FAIL", std::nullopt)
      .set("AIRHOST_FAKE_NVML_TOPOLOGY", std::nullopt)
      .set("AIRHOST_CUDART_LIBRARY", AIRHOST_FAKE_CUDART_PATH)
      .set("AIRHOST_FAKE_CUDA_DEVICES", "2")
      .set("AIRHOST_FAKE_CUDA_EVENT_MS", "1")
      .set("AIRHOST_CUBLAS_LIBRARY", AIRHOST_FAKE_CUBLAS_PATH)
      .set("AIRHOST_NCCL_LIBRARY", sdk_lib("libnccl.so.2"))
      .set("CUDA_VISIBLE_DEVICES", std::nullopt);
  airhost::detail::DoctorOptions options;
  options.sizes = {8};
  options.memory_bytes = 1 << 20;
  options.gemm_n = 64;
  const airhost::detail::DoctorReport r = airhost::detail::run_doctor(options);
  CHECK(r.exit_code == 4);
  REQUIRE(r.nccl.loaded);
  CHECK(r.nccl.version == std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
  CHECK_FALSE(r.allreduce_ran);
  REQUIRE(r.problems.size() == 1);
  const std::string& problem = r.problems.front();
  CHECK(problem.rfind("NCCL could not start on 2 GPU(s): ncclCommInitAll: ", 0) == 0);
  CHECK(problem.find("(NCCL error ") != std::string::npos);
  CHECK(problem.find("NCCL_DEBUG") != std::string::npos);  // NCCL's own advice, or ours
  MESSAGE(problem);
}
