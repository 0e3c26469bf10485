// fake_cublas.cpp — test fake: stands in for libcublas.so (NVIDIA's cuBLAS) on a GPU, which
// this machine does not have. It is NOT NVIDIA's library: cublasSgemm_v2 computes the
// product on the CPU, naively, over the fake CUDA runtime's "device memory" (host memory,
// tests/fake_cuda/fake_cudart.cpp), so tests must ask for small matrices (at most 2^27
// multiply-adds; bigger ones fail with CUBLAS_STATUS_NOT_SUPPORTED). Tests point airhost at
// it with AIRHOST_CUBLAS_LIBRARY=<path of libfake-cublas.so>.
#include <cstddef>

namespace {

using cublasStatus_t = int;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_INITIALIZED = 1;
constexpr cublasStatus_t CUBLAS_STATUS_INVALID_VALUE = 7;
constexpr cublasStatus_t CUBLAS_STATUS_NOT_SUPPORTED = 15;
constexpr int CUBLAS_OP_N = 0;  // cublasOperation_t

struct FakeHandle {
  void* stream = nullptr;
};

}  // namespace

#define FAKE_CUBLAS_API extern "C" __attribute__((visibility("default")))

FAKE_CUBLAS_API cublasStatus_t cublasCreate_v2(void** handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new FakeHandle;
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_CUBLAS_API cublasStatus_t cublasDestroy_v2(void* handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete static_cast<FakeHandle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_CUBLAS_API cublasStatus_t cublasGetVersion_v2(void* handle, int* version) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!version) return CUBLAS_STATUS_INVALID_VALUE;
  *version = 120402;  // 12.4.2
  return CUBLAS_STATUS_SUCCESS;
}

FAKE_CUBLAS_API cublasStatus_t cublasSetStream_v2(void* handle, void* stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  static_cast<FakeHandle*>(handle)->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

// C = alpha * A * B + beta * C, column-major, no transposes (all airhost asks for).
FAKE_CUBLAS_API cublasStatus_t cublasSgemm_v2(void* handle, int transa, int transb, int m, int n,
                                              int k, const float* alpha, const float* A, int lda,
                                              const float* B, int ldb, const float* beta, float* C,
                                              int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (transa != CUBLAS_OP_N || transb != CUBLAS_OP_N) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0 || !alpha || !beta || lda < m || ldb < k || ldc < m) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (static_cast<double>(m) * n * k > static_cast<double>(1 << 27)) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) acc += A[i + static_cast<size_t>(p) * lda] * B[p + static_cast<size_t>(j) * ldb];
      float& c = C[i + static_cast<size_t>(j) * ldc];
      c = *alpha * acc + (*beta == 0.0f ? 0.0f : *beta * c);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Each entry point airhost resolves takes the calls airhost makes (host/gpu/nvidia_api.hpp, itself
// checked against NVIDIA's headers by tests/abi/check_gpu_abi.cpp).
#include "abi_compat.hpp"
#include "gpu/nvidia_api.hpp"
AIRHOST_CHECK_AGAINST_GPU_ABI(cublasCreate_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(cublasDestroy_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(cublasGetVersion_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(cublasSgemm_v2);
