// doctor_compute.cpp — the doctor's per-GPU checks: memory (a cudaMalloc, memsets, a
// device-to-device copy checked at both ends and timed) and compute (a cuBLAS SGEMM, timed,
// its result checked); plus the CUDA helpers they share with the all-reduce.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/doctor_parts.hpp"

namespace airhost::detail::doctor {

namespace {

std::string cublas_status(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS status " + std::to_string(s);
  }
}

}  // namespace

float elapsed_ms(const Cudart& cuda, cudaEvent_t start, cudaEvent_t end, const std::string& where) {
  cuda_ok(cuda, cuda.cudaEventSynchronize(end), where + ": cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cuda, cuda.cudaEventElapsedTime(&ms, start, end), where + ": cudaEventElapsedTime");
  if (!(ms > 0)) ms = 1e-6f;  // a timer too coarse for the work: avoid dividing by zero
  return ms;
}

float float_of_byte(unsigned char byte) {
  unsigned char b[4] = {byte, byte, byte, byte};
  float f;
  std::memcpy(&f, b, sizeof f);
  return f;
}

bool close_to(double value, double expected, double rel) {
  return std::isfinite(value) && std::fabs(value - expected) <= rel * std::fabs(expected) + 1e-30;
}

void check_memory(DoctorReport& r, const Cudart& cuda, int device, DoctorGpu& g, const Plan& plan) {
  g.memory_checked = true;
  const std::string where = device_label(r, &g, device);
  try {
    CudaScope scope(cuda);
    cuda_ok(cuda, cuda.cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    void* buf = nullptr;
    cuda_ok(cuda, scope.alloc(device, &buf, plan.memory_bytes), "cudaMalloc of " + bytes_text(plan.memory_bytes));
    const size_t half = plan.memory_bytes / 2 / 256 * 256;
    char* src = static_cast<char*>(buf);
    char* dst = src + half;
    cuda_ok(cuda, cuda.cudaMemset(src, 0xA5, half), "cudaMemset");
    cuda_ok(cuda, cuda.cudaMemset(dst, 0x00, half), "cudaMemset");
    cuda_ok(cuda, cuda.cudaMemcpy(dst, src, half, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
    // The copy must have carried the bytes: look at its two ends.
    const size_t probe = std::min<size_t>(half, 4096);
    std::vector<unsigned char> host(probe);
    for (size_t offset : {size_t{0}, half - probe}) {
      cuda_ok(cuda, cuda.cudaMemcpy(host.data(), dst + offset, probe, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
      if (std::any_of(host.begin(), host.end(), [](unsigned char b) { return b != 0xA5; })) {
        throw CheckFailed("a device-to-device copy did not carry its bytes (memory corruption?)");
      }
    }
    cudaEvent_t start = nullptr, end = nullptr;
    cuda_ok(cuda, scope.event(device, &start), "cudaEventCreate");
    cuda_ok(cuda, scope.event(device, &end), "cudaEventCreate");
    cuda_ok(cuda, cuda.cudaEventRecord(start, nullptr), "cudaEventRecord");
    for (int i = 0; i < plan.copy_iters; ++i) {
      cuda_ok(cuda, cuda.cudaMemcpy(dst, src, half, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
    }
    cuda_ok(cuda, cuda.cudaEventRecord(end, nullptr), "cudaEventRecord");
    const float ms = elapsed_ms(cuda, start, end, "the copy timing");
    g.copy_gbps = 2.0 * static_cast<double>(half) * plan.copy_iters / (ms / 1e3) / 1e9;
    g.memory_ok = true;
  } catch (const CheckFailed& e) {
    g.memory_error = e.what();
    r.problems.push_back(where + ": memory check: " + g.memory_error);
  }
}

void check_gemm(DoctorReport& r, const Cudart& cuda, const Cublas& blas, int device, DoctorGpu& g,
                const Plan& plan) {
  const std::string where = device_label(r, &g, device);
  cublasHandle_t handle = nullptr;
  try {
    CudaScope scope(cuda);
    cuda_ok(cuda, cuda.cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    const int n = plan.gemm_n;
    const size_t bytes = static_cast<size_t>(n) * n * sizeof(float);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    cuda_ok(cuda, scope.alloc(device, &a, bytes), "cudaMalloc of the SGEMM matrices");
    cuda_ok(cuda, scope.alloc(device, &b, bytes), "cudaMalloc of the SGEMM matrices");
    cuda_ok(cuda, scope.alloc(device, &c, bytes), "cudaMalloc of the SGEMM matrices");
    const unsigned char byte = 0x3C;  // every element 0.0115: no denormals, no overflow
    cuda_ok(cuda, cuda.cudaMemset(a, byte, bytes), "cudaMemset");
    cuda_ok(cuda, cuda.cudaMemset(b, byte, bytes), "cudaMemset");
    cuda_ok(cuda, cuda.cudaMemset(c, 0, bytes), "cudaMemset");
    if (cublasStatus_t s = blas.cublasCreate_v2(&handle); s != CUBLAS_STATUS_SUCCESS) {
      handle = nullptr;
      throw CheckFailed("cublasCreate failed: " + cublas_status(s));
    }
    if (r.cublas.version.empty() && blas.cublasGetVersion_v2) {
      int v = 0;
      if (blas.cublasGetVersion_v2(handle, &v) == CUBLAS_STATUS_SUCCESS) r.cublas.version = library_version(v);
    }
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&] {
      cublasStatus_t s = blas.cublasSgemm_v2(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, static_cast<float*>(a), n,
                                    static_cast<float*>(b), n, &beta, static_cast<float*>(c), n);
      if (s != CUBLAS_STATUS_SUCCESS) throw CheckFailed("cublasSgemm failed: " + cublas_status(s));
    };
    gemm();  // warm-up: cuBLAS picks and loads its kernel
    cudaEvent_t start = nullptr, end = nullptr;
    cuda_ok(cuda, scope.event(device, &start), "cudaEventCreate");
    cuda_ok(cuda, scope.event(device, &end), "cudaEventCreate");
    cuda_ok(cuda, cuda.cudaEventRecord(start, nullptr), "cudaEventRecord");
    for (int i = 0; i < plan.gemm_iters; ++i) gemm();
    cuda_ok(cuda, cuda.cudaEventRecord(end, nullptr), "cudaEventRecord");
    const float ms = elapsed_ms(cuda, start, end, "the SGEMM timing");
    // Every element of C is n * x * x.
    const double x = float_of_byte(byte);
    const double expected = n * x * x;
    for (size_t at : {size_t{0}, static_cast<size_t>(n) * n - 1}) {
      float value = 0;
      cuda_ok(cuda, cuda.cudaMemcpy(&value, static_cast<float*>(c) + at, sizeof value, cudaMemcpyDeviceToHost),
              "cudaMemcpy device to host");
      if (!close_to(value, expected, 1e-2)) {
        throw CheckFailed(format("SGEMM computed %g where %g was expected", value, expected));
      }
    }
    g.gemm_ran = true;
    g.gemm_tflops = 2.0 * n * static_cast<double>(n) * n * plan.gemm_iters / (ms / 1e3) / 1e12;
  } catch (const CheckFailed& e) {
    g.gemm_error = e.what();
    r.problems.push_back(where + ": compute check: " + g.gemm_error);
  }
  if (handle) blas.cublasDestroy_v2(handle);
}

}  // namespace airhost::detail::doctor
