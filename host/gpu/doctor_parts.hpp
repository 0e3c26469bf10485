// doctor_parts.hpp — what the parts of `airhost doctor` share, internal to host/gpu/: the
// plan of one run, the libraries' entry points with their error texts, the CUDA helpers of
// the device checks, and each part's entry point. Each part is one file:
//   doctor_inventory.cpp  NVML: the GPUs, their topology, the accelerator type
//   doctor_libraries.cpp  the CUDA runtime, NCCL and cuBLAS loaded; CUDA's devices matched
//                         to NVML's GPUs; what a node without a usable GPU has
//   doctor_compute.cpp    per GPU: memory (allocation, copy) and compute (SGEMM)
//   doctor_nccl.cpp       the NCCL all-reduce and its nccl-tests arithmetic
//   doctor_report.cpp     the verdict (exit code, summary), the text and the JSON
//   doctor.cpp            the plan, run_doctor in order, run_doctor_in_child
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/util.hpp"
#include "gpu/doctor.hpp"
#include "gpu/nvidia_api.hpp"

namespace airhost::detail::doctor {

using namespace nvidia;

// DoctorOptions with every default filled in (doctor.cpp).
struct Plan {
  std::vector<std::size_t> sizes;
  int warmup = 0, iters = 0, copy_iters = 0, gemm_iters = 0, gemm_n = 0;
  std::size_t memory_bytes = 0;
};
Plan make_plan(const DoctorOptions& o);

// --- Text (doctor_report.cpp) ---------------------------------------------------------------

// printf into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// "16 MiB", "1.5 GiB" (base/util.hpp).
using detail::bytes_text;
// "GPU 3", "GPU 3 (cuda:0)" when CUDA_VISIBLE_DEVICES renumbers it, "CUDA device 2" for a GPU
// NVML does not list.
std::string device_label(const DoctorReport& r, const DoctorGpu* g, int cuda_device);
// Why no GPU is usable, for a report of exit code 3.
std::string no_gpu_reason(const DoctorReport& r);
// The verdict: exit_code, summary and library_missing, from what the checks put in `r`.
void conclude(DoctorReport& r, bool gpus_usable);

// --- The libraries' entry points (nvidia_api.hpp), and what the checks say of their errors --

struct Cudart : CudartApi {
  int runtime = 0;  // its version, as cudaRuntimeGetVersion gives it (12040 for 12.4)

  std::string describe(cudaError_t rc) const {
    const char* text = cudaGetErrorString ? cudaGetErrorString(rc) : nullptr;
    return std::string(text && *text ? text : "unknown error") + " (CUDA error " + std::to_string(rc) + ")";
  }
};

struct Nccl : NcclApi {
  std::string describe(ncclResult_t rc) const {
    const char* text = ncclGetErrorString ? ncclGetErrorString(rc) : nullptr;
    std::string out = std::string(text && *text ? text : "unknown error") + " (NCCL error " +
                      std::to_string(rc) + ")";
    const char* last = ncclGetLastError ? ncclGetLastError(nullptr) : nullptr;
    if (last && *last) out += ": " + std::string(last);
    return out;
  }
};

using Cublas = CublasApi;

// --- The parts ------------------------------------------------------------------------------

// NVML: the GPUs, their topology and the accelerator type. False when no GPU is usable.
bool check_gpus(DoctorReport& r);

// Each opens its library and resolves what the checks call; fills `status` (the error says
// why not; for the CUDA runtime and NCCL, the version, which needs no GPU). False when the
// library is unusable. None calls anything that needs a GPU.
bool load_cudart(LibraryStatus& status, Cudart& cuda);
bool load_nccl(LibraryStatus& status, Nccl& nccl);
bool load_cublas(LibraryStatus& status, Cublas& blas);
// The CUDA runtime: loaded, and seeing the GPUs. Fills `cuda`, and `gpu_of_device` with the
// index into r.gpus of each CUDA ordinal; false (a problem in `r`) when unusable.
bool check_cuda_runtime(DoctorReport& r, Cudart& cuda, std::vector<int>& gpu_of_device);
// No GPU is usable: which CUDA libraries the node has all the same, touching no device.
void probe_libraries_without_gpu(DoctorReport& r);

// CUDA device `device`, which is `g`: allocation, memset, copy (doctor_compute.cpp).
void check_memory(DoctorReport& r, const Cudart& cuda, int device, DoctorGpu& g, const Plan& plan);
// The same device: an SGEMM, timed and its result checked.
void check_gemm(DoctorReport& r, const Cudart& cuda, const Cublas& blas, int device, DoctorGpu& g,
                const Plan& plan);
// The all-reduce over every CUDA device, one communicator each (doctor_nccl.cpp).
void check_allreduce(DoctorReport& r, const Cudart& cuda, const Nccl& nccl, const Plan& plan);

// --- CUDA helpers of the device checks --------------------------------------------------------

// Thrown inside one check to end it with a sentence; caught by the check.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_ok(const Cudart& cuda, cudaError_t rc, const std::string& what) {
  if (rc != cudaSuccess) throw CheckFailed(what + " failed: " + cuda.describe(rc));
}

// Frees what it holds at scope end; every CUDA object the checks create goes through one.
struct CudaScope {
  const Cudart& cuda;
  std::vector<std::pair<int, void*>> buffers;
  std::vector<std::pair<int, cudaStream_t>> streams;
  std::vector<std::pair<int, cudaEvent_t>> events;
  explicit CudaScope(const Cudart& c) : cuda(c) {}
  CudaScope(const CudaScope&) = delete;
  CudaScope& operator=(const CudaScope&) = delete;
  ~CudaScope() {
    for (auto& [d, e] : events) {
      cuda.cudaSetDevice(d);
      cuda.cudaEventDestroy(e);
    }
    for (auto& [d, s] : streams) {
      cuda.cudaSetDevice(d);
      cuda.cudaStreamDestroy(s);
    }
    for (auto& [d, p] : buffers) {
      cuda.cudaSetDevice(d);
      cuda.cudaFree(p);
    }
  }
  cudaError_t alloc(int device, void** p, std::size_t bytes) {
    cudaError_t rc = cuda.cudaMalloc(p, bytes);
    if (rc == cudaSuccess) buffers.emplace_back(device, *p);
    return rc;
  }
  cudaError_t stream(int device, cudaStream_t* s) {
    cudaError_t rc = cuda.cudaStreamCreate(s);
    if (rc == cudaSuccess) streams.emplace_back(device, *s);
    return rc;
  }
  cudaError_t event(int device, cudaEvent_t* e) {
    cudaError_t rc = cuda.cudaEventCreate(e);
    if (rc == cudaSuccess) events.emplace_back(device, *e);
    return rc;
  }
};

// Milliseconds between two recorded events, after waiting for the second.
float elapsed_ms(const Cudart& cuda, cudaEvent_t start, cudaEvent_t end, const std::string& where);

// The float whose four bytes all are `byte`: what cudaMemset writes into a float buffer.
float float_of_byte(unsigned char byte);

// |value - expected| within `rel` of expected, and finite.
bool close_to(double value, double expected, double rel);

}  // namespace airhost::detail::doctor
