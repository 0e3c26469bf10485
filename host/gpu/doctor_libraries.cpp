// doctor_libraries.cpp — the doctor's CUDA libraries: the CUDA runtime, NCCL and cuBLAS
// opened (libraries.hpp) and their entry points resolved (nvidia_api.hpp); the CUDA runtime's
// devices matched to NVML's GPUs; and, on a node without a usable GPU, which libraries it has.
#include "gpu/doctor_parts.hpp"
#include "gpu/libraries.hpp"
#include "gpu/topology.hpp"

namespace airhost::detail::doctor {

namespace {

// cudaGetDeviceCount into `count`; "" when it sees a device, else why not (the runtime's
// error, or that it counts none).
std::string count_devices(const Cudart& cuda, int& count) {
  count = 0;
  const cudaError_t rc = cuda.cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    count = 0;
    return cuda.describe(rc);
  }
  return count > 0 ? "" : "it counts 0 devices";
}

}  // namespace

bool load_cudart(LibraryStatus& status, Cudart& cuda) {
  OpenedLibrary lib = open_library(cuda_runtime_library());
  status = lib.status;
  if (!lib.handle) return false;
  if (const char* missing = resolve(lib.handle, cuda)) {
    status.loaded = false;
    status.error = status.path + " lacks " + missing + ": it is not a CUDA runtime library";
    return false;
  }
  if (cuda.cudaRuntimeGetVersion(&cuda.runtime) == cudaSuccess) status.version = cuda_version_string(cuda.runtime);
  return true;
}

bool load_nccl(LibraryStatus& status, Nccl& nccl) {
  OpenedLibrary lib = open_library(nccl_library());
  status = lib.status;
  if (!lib.handle) return false;
  if (resolve(lib.handle, nccl)) {
    status.loaded = false;
    status.error = status.path + " lacks an NCCL call airhost needs (ncclCommInitAll, ncclAllReduce, ...): "
                   "it is not NCCL 2";
    return false;
  }
  int v = 0;
  if (nccl.ncclGetVersion(&v) == ncclSuccess) status.version = library_version(v);
  return true;
}

bool load_cublas(LibraryStatus& status, Cublas& blas) {
  OpenedLibrary lib = open_library(cublas_library());
  status = lib.status;
  if (!lib.handle) return false;
  if (resolve(lib.handle, blas)) {
    status.loaded = false;
    status.error = status.path + " lacks cublasCreate_v2, cublasDestroy_v2 or cublasSgemm_v2";
    return false;
  }
  return true;
}

bool check_cuda_runtime(DoctorReport& r, Cudart& cuda, std::vector<int>& gpu_of_device) {
  if (!load_cudart(r.cudart, cuda)) {
    r.problems.push_back(r.cudart.error);
    return false;
  }
  int count = 0;
  if (const std::string why = count_devices(cuda, count); !why.empty()) {
    std::string msg = "the CUDA runtime " + r.cudart.version + " (" + r.cudart.path +
                      ") sees no GPU although NVML lists " + std::to_string(r.gpus.size()) + ": " + why;
    int driver = 0;
    if (cuda.cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0 && cuda.runtime > driver) {
      msg += "; this CUDA runtime needs a driver for CUDA " + cuda_version_string(cuda.runtime) +
             " or newer and the driver supports CUDA " + cuda_version_string(driver) +
             ": update the driver or use an older CUDA runtime";
    }
    r.problems.push_back(msg);
    return false;
  }
  r.cuda_device_count = count;

  // CUDA ordinals → NVML GPUs, by PCI bus ID (CUDA orders by speed unless
  // CUDA_DEVICE_ORDER=PCI_BUS_ID); by position when the IDs are unavailable.
  gpu_of_device.assign(static_cast<size_t>(count), -1);
  const int nvml_count = static_cast<int>(r.gpus.size());
  std::vector<bool> taken(r.gpus.size(), false);
  for (int d = 0; d < count && cuda.cudaDeviceGetPCIBusId; ++d) {
    char bus[64] = {};
    if (cuda.cudaDeviceGetPCIBusId(bus, sizeof bus, d) != cudaSuccess) continue;
    for (size_t i = 0; i < r.gpus.size(); ++i) {
      if (!taken[i] && !r.gpus[i].pci_bus_id.empty() && same_pci_device(bus, r.gpus[i].pci_bus_id)) {
        gpu_of_device[d] = static_cast<int>(i);
        taken[i] = true;
        break;
      }
    }
  }
  for (int d = 0; d < count; ++d) {
    if (gpu_of_device[d] >= 0) continue;
    if (d < nvml_count && !taken[d]) {
      gpu_of_device[d] = d;
      taken[d] = true;
    } else {
      DoctorGpu extra;
      extra.index = -1;
      extra.name = "CUDA device " + std::to_string(d) + " (not matched to an NVML GPU)";
      r.gpus.push_back(std::move(extra));
      taken.push_back(true);
      gpu_of_device[d] = static_cast<int>(r.gpus.size()) - 1;
    }
  }
  for (int d = 0; d < count; ++d) r.gpus[gpu_of_device[d]].cuda_device = d;
  if (count != nvml_count) {
    r.notes.push_back("the CUDA runtime sees " + std::to_string(count) + " GPU(s) and NVML " +
                      std::to_string(nvml_count) + "; the CUDA and NCCL checks cover CUDA's");
  }
  return true;
}

// No GPU is usable: still say which CUDA libraries this node has and what the CUDA runtime
// makes of it, without touching a device. A node whose container was started without its
// GPUs has the libraries and no driver; one with a broken driver install has NVML missing
// and the runtime failing with the driver's reason.
void probe_libraries_without_gpu(DoctorReport& r) {
  Cudart cuda;
  if (load_cudart(r.cudart, cuda)) {
    if (const std::string why = count_devices(cuda, r.cuda_device_count); !why.empty()) {
      r.cuda_device_error = "cudaGetDeviceCount: " + why;
    }
  }
  Nccl nccl;
  load_nccl(r.nccl, nccl);
  Cublas blas;
  load_cublas(r.cublas, blas);
}

}  // namespace airhost::detail::doctor
