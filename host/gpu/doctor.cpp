// doctor.cpp — `airhost doctor`: GPUs, topology, CUDA memory and compute, NCCL all-reduce.
//
// Like accelerators.cpp for NVML, nothing of CUDA is linked or needed at build time: the
// CUDA runtime, NCCL and cuBLAS are opened with dlopen, and the few declarations used are
// written out in nvidia_api.hpp (checked against NVIDIA's headers by tests/abi).
// The libraries are never closed again: the CUDA runtime and NCCL register exit handlers
// and threads that must not outlive their code.
#include "gpu/doctor.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>

#include "gpu/accelerators.hpp"
#include "airhost/exit_code.hpp"
#include "gpu/nvidia_api.hpp"
#include "util.hpp"

namespace airhost::detail {

namespace {

using namespace nvidia;

// The libraries' entry points (nvidia_api.hpp), and what the checks say of their errors.
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

// --- Loading --------------------------------------------------------------------------------

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(out.data(), out.size(), fmt, ap);
  va_end(ap);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return bytes == std::floor(bytes) ? format("%.0f %s", bytes, units[u]) : format("%.1f %s", bytes, units[u]);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// site-packages of the Python environment airhost belongs to: pip puts NVIDIA's wheels
// (nvidia-nccl-cu12, the CUDA runtime and cuBLAS torch depends on) under nvidia/*/lib there.
std::vector<std::string> site_packages_dirs() {
  std::vector<std::string> prefixes;
  const std::string exe = executable_path();
  if (!exe.empty()) prefixes.push_back(dirname_of(dirname_of(exe)));
#ifdef AIRHOST_DEFAULT_PYTHON
  prefixes.push_back(dirname_of(dirname_of(AIRHOST_DEFAULT_PYTHON)));
#endif
  std::vector<std::string> dirs;
#ifdef AIRHOST_PYTHON_VERSION
  for (const auto& prefix : prefixes) {
    for (const char* kind : {"site-packages", "dist-packages"}) {
      std::string dir = prefix + "/lib/python" AIRHOST_PYTHON_VERSION "/" + kind;
      if (exists(dir) && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    }
  }
#endif
  return dirs;
}

// The file a dlopen handle maps.
std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

struct Library {
  void* handle = nullptr;
  LibraryStatus status;
};

// Files in `dir` named <stem>.so* or <stem>-<hash>.so* (torch/lib bundles libraries so).
std::vector<std::string> bundled(const std::string& dir, const std::string& stem) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) == 0 && name.size() > stem.size() && (name[stem.size()] == '.' || name[stem.size()] == '-') &&
        name.find(".so") != std::string::npos) {
      found.push_back(entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Opens $env_var if set (that file only), else the first of `names` that loads, as bare
// sonames (the loader's search path), then under /usr/local/cuda/lib64 and $CONDA_PREFIX/lib,
// then in the Python environment: nvidia/<wheel_dirs>/lib, and torch/lib for <stem>*.so*.
Library open_library(const char* what, const char* env_var, const std::vector<std::string>& names,
                     const std::vector<std::string>& wheel_dirs, const std::string& stem,
                     const std::string& install_hint) {
  Library lib;
  const char* from_env = std::getenv(env_var);
  if (from_env && *from_env) {
    lib.handle = dlopen(from_env, RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) {
      const char* why = dlerror();
      lib.status.error = std::string(what) + " could not be loaded: " + env_var + "=" + from_env +
                         ": " + (why ? why : "unknown dlopen error");
      return lib;
    }
    lib.status.loaded = true;
    lib.status.path = loaded_path(lib.handle, from_env);
    return lib;
  }

  std::vector<std::string> candidates = names;
  for (const auto& n : names) candidates.push_back("/usr/local/cuda/lib64/" + n);
  if (const char* conda = std::getenv("CONDA_PREFIX"); conda && *conda) {
    for (const auto& n : names) candidates.push_back(std::string(conda) + "/lib/" + n);
  }
  for (const auto& sp : site_packages_dirs()) {
    for (const auto& dir : wheel_dirs) {
      for (const auto& n : names) candidates.push_back(sp + "/nvidia/" + dir + "/lib/" + n);
    }
    for (const auto& b : bundled(sp + "/torch/lib", stem)) candidates.push_back(b);
  }
  std::vector<std::string> broken;  // found, but would not load (a missing dependency, say)
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && !exists(c)) continue;
    lib.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      lib.status.loaded = true;
      lib.status.path = loaded_path(lib.handle, c);
      return lib;
    }
    const char* why = dlerror();
    std::string reason = why ? why : "unknown dlopen error";
    if (reason.find("No such file") == std::string::npos) broken.push_back(reason);
  }
  std::string tried;
  for (const auto& n : names) tried += (tried.empty() ? "" : ", ") + n;
  lib.status.error = std::string(what) + " not found (tried " + tried +
                     " on the library path, in /usr/local/cuda/lib64 and in the Python "
                     "environment's nvidia/ wheels and torch/lib)";
  if (!broken.empty()) lib.status.error += "; found but not loadable: " + broken.front();
  lib.status.error += "; " + install_hint + ", or set " + env_var + " to its path";
  return lib;
}

// --- Helpers --------------------------------------------------------------------------------


std::string library_version(int code) {  // NCCL: 22105 → 2.21.5 (2.9 on), 2708 → 2.7.8
  if (code <= 0) return "";
  if (code >= 10000) return format("%d.%d.%d", code / 10000, (code % 10000) / 100, code % 100);
  return format("%d.%d.%d", code / 1000, (code % 1000) / 100, code % 100);
}

// The float whose four bytes all are `byte`: what cudaMemset writes into a float buffer.
float float_of_byte(unsigned char byte) {
  unsigned char b[4] = {byte, byte, byte, byte};
  float f;
  std::memcpy(&f, b, sizeof f);
  return f;
}

// Device d's all-reduce input: every float is float_of_byte(pattern_byte(d)), a normal
// number between 0.01 and 200, different for neighbouring devices.
unsigned char pattern_byte(int d) { return static_cast<unsigned char>(0x3C + d % 8); }

bool close_to(double value, double expected, double rel) {
  return std::isfinite(value) && std::fabs(value - expected) <= rel * std::fabs(expected) + 1e-30;
}

std::string device_label(const DoctorReport& r, const DoctorGpu* g, int cuda_device) {
  if (!g || g->index < 0) return "CUDA device " + std::to_string(cuda_device);
  std::string label = "GPU " + std::to_string(g->index);
  if (r.cuda_visible_devices_set && g->index != cuda_device) label += " (cuda:" + std::to_string(cuda_device) + ")";
  return label;
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
  cudaError_t alloc(int device, void** p, size_t bytes) {
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

// Thrown inside one check to end it with a sentence; caught by the check.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void cuda_ok(const Cudart& cuda, cudaError_t rc, const std::string& what) {
  if (rc != cudaSuccess) throw CheckFailed(what + " failed: " + cuda.describe(rc));
}

// Milliseconds between two recorded events, after waiting for the second.
float elapsed_ms(const Cudart& cuda, cudaEvent_t start, cudaEvent_t end, const std::string& where) {
  cuda_ok(cuda, cuda.cudaEventSynchronize(end), where + ": cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cuda, cuda.cudaEventElapsedTime(&ms, start, end), where + ": cudaEventElapsedTime");
  if (!(ms > 0)) ms = 1e-6f;  // a timer too coarse for the work: avoid dividing by zero
  return ms;
}

// --- The checks -----------------------------------------------------------------------------

struct Plan {
  std::vector<size_t> sizes;
  int warmup = 0, iters = 0, copy_iters = 0, gemm_iters = 0, gemm_n = 0;
  size_t memory_bytes = 0;
};

Plan make_plan(const DoctorOptions& o) {
  Plan p;
  p.sizes = allreduce_sizes(o);
  p.warmup = o.warmup_iters > 0 ? o.warmup_iters : (o.quick ? 2 : 5);
  p.iters = o.iters > 0 ? o.iters : (o.quick ? 5 : 20);
  p.copy_iters = o.quick ? 2 : 5;
  p.gemm_iters = o.quick ? 2 : 5;
  p.gemm_n = o.gemm_n > 0 ? o.gemm_n : 4096;
  p.memory_bytes = o.memory_bytes > 0 ? o.memory_bytes : (o.quick ? size_t{256} << 20 : size_t{1} << 30);
  return p;
}

// NVML: the GPUs, their topology and the accelerator type. False when no GPU is usable.
bool check_gpus(DoctorReport& r) {
  const AcceleratorInventory inv = detect_accelerators();
  r.nvml_loaded = inv.nvml_loaded;
  r.nvml_error = inv.nvml_error;
  r.driver_version = inv.driver_version;
  r.node_gpu_count = inv.node_gpu_count;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    r.cuda_visible_devices_set = true;
    r.cuda_visible_devices = cvd;
  }
  for (const auto& g : inv.gpus) {
    DoctorGpu d;
    d.index = g.index;
    d.name = g.name;
    d.uuid = g.uuid;
    d.memory_total = g.memory_total;
    r.gpus.push_back(std::move(d));
  }
  if (r.gpus.empty()) return false;

  const GpuTopology topo = detect_topology(inv);
  r.cuda_driver_version = topo.cuda_driver_version;
  r.topology = topo.links;
  for (size_t i = 0; i < r.gpus.size() && i < topo.pci_bus_ids.size(); ++i) {
    r.gpus[i].pci_bus_id = topo.pci_bus_ids[i];
  }
  if (!topo.error.empty()) r.notes.push_back("topology unknown: " + topo.error);

  r.accelerators_toml = find_accelerators_toml();
  if (r.accelerators_toml.empty()) {
    r.notes.push_back("accelerator type unknown: configs/accelerators.toml not found (set "
                      "AIRHOST_ACCELERATORS_TOML to it)");
    return true;
  }
  std::vector<AcceleratorType> types;
  try {
    types = load_accelerator_types(r.accelerators_toml);
  } catch (const std::exception& e) {
    r.notes.push_back(std::string("accelerator type unknown: ") + e.what());
    return true;
  }
  std::set<std::string> models, unknown;
  for (auto& g : r.gpus) {
    g.model = gpu_model_of(types, g.name).value_or("");
    if (g.model.empty()) {
      unknown.insert(g.name);
    } else {
      models.insert(g.model);
    }
  }
  for (const auto& name : unknown) {
    r.notes.push_back("accelerator type unknown: " + r.accelerators_toml + " knows no model for '" + name + "'");
  }
  if (!unknown.empty()) return true;
  if (models.size() != 1) {
    r.notes.push_back("accelerator type unknown: the GPUs are of different models");
    return true;
  }
  const std::string model = *models.begin();
  const int n = static_cast<int>(r.gpus.size());
  std::string known;
  for (const auto& t : types) {
    if (t.gpu != model) continue;
    if (t.count == n) {
      r.accelerator_type = t.name;
      return true;
    }
    known += (known.empty() ? "" : ", ") + t.name;
  }
  r.notes.push_back("accelerator type unknown: " + r.accelerators_toml + " has no type of " +
                    std::to_string(n) + " x " + model + (known.empty() ? "" : " (it has " + known + ")"));
  return true;
}

std::string no_gpu_reason(const DoctorReport& r) {
  if (!r.nvml_loaded) return r.nvml_error.empty() ? "NVML could not be used" : r.nvml_error;
  if (r.node_gpu_count == 0) return "the NVIDIA driver is loaded but NVML lists no GPU";
  std::string why = "CUDA_VISIBLE_DEVICES='" + r.cuda_visible_devices + "' hides all " +
                    std::to_string(r.node_gpu_count) + " of the node's GPUs";
  if (!r.nvml_error.empty()) why += " (" + r.nvml_error + ")";
  return why;
}

// Opens the CUDA runtime and resolves what the checks call. Fills `status` (its error says
// why not) and `cuda`; false when unusable. Calls nothing that needs a GPU.
bool load_cudart(LibraryStatus& status, Cudart& cuda) {
  Library lib = open_library("the CUDA runtime (libcudart)", "AIRHOST_CUDART_LIBRARY",
                             {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"},
                             {"cuda_runtime", "cu13"}, "libcudart",
                             "install it (pip install nvidia-cuda-runtime-cu12, which torch's CUDA "
                             "wheels bring, or the CUDA toolkit)");
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

// The CUDA runtime: loaded, and seeing the GPUs. Fills `cuda`; false when unusable.
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

// Opens cuBLAS and resolves the SGEMM calls; fills `status`, false when unusable.
bool load_cublas(LibraryStatus& status, Cublas& blas) {
  Library lib = open_library("cuBLAS (libcublas)", "AIRHOST_CUBLAS_LIBRARY",
                             {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"},
                             {"cublas", "cu13"}, "libcublas",
                             "install it (pip install nvidia-cublas-cu12, which torch's CUDA wheels "
                             "bring, or the CUDA toolkit)");
  status = lib.status;
  if (!lib.handle) return false;
  if (resolve(lib.handle, blas)) {
    status.loaded = false;
    status.error = status.path + " lacks cublasCreate_v2, cublasDestroy_v2 or cublasSgemm_v2";
    return false;
  }
  return true;
}

bool load_cublas(DoctorReport& r, Cublas& blas) {
  if (load_cublas(r.cublas, blas)) return true;
  r.notes.push_back("compute check skipped: " + r.cublas.error);
  return false;
}

// Opens NCCL and resolves the all-reduce calls; fills `status` (with NCCL's version, which
// needs no GPU), false when unusable.
bool load_nccl(LibraryStatus& status, Nccl& nccl) {
  Library lib = open_library("NCCL (libnccl)", "AIRHOST_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"},
                             {"nccl"}, "libnccl",
                             "install it (pip install nvidia-nccl-cu12, which torch's CUDA wheels "
                             "bring, or the libnccl2 package)");
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

bool load_nccl(DoctorReport& r, Nccl& nccl) {
  if (load_nccl(r.nccl, nccl)) return true;
  r.problems.push_back(r.nccl.error);
  return false;
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

// NCCL's own messages mostly say to rerun with NCCL_DEBUG; the others get the hint here.
std::string debug_hint(const std::string& message) {
  return message.find("NCCL_DEBUG") == std::string::npos ? "; rerun with NCCL_DEBUG=INFO for NCCL's reasons" : "";
}

// The all-reduce over every CUDA device, one communicator each, from this one thread.
void check_allreduce(DoctorReport& r, const Cudart& cuda, const Nccl& nccl, const Plan& plan) {
  const int n = r.cuda_device_count;
  r.allreduce_ranks = n;
  size_t max_bytes = 4;
  for (size_t s : plan.sizes) max_bytes = std::max(max_bytes, s);
  max_bytes = (max_bytes + 3) / 4 * 4;

  // Destroyed before the buffers and streams they used (declared after the scope below);
  // after a failure aborted instead, as NCCL asks (a destroy could wait forever).
  struct Communicators {
    const Nccl& nccl;
    std::vector<ncclComm_t> comms;
    bool made = false, failed = false;
    ~Communicators() {
      if (!made) return;
      if (std::uncaught_exceptions() > 0) failed = true;  // a check failed mid-way
      for (auto c : comms) {
        if (!c) continue;
        if (failed && nccl.ncclCommAbort) {
          nccl.ncclCommAbort(c);
        } else {
          nccl.ncclCommDestroy(c);
        }
      }
    }
  };
  try {
    CudaScope scope(cuda);
    Communicators communicators{nccl, std::vector<ncclComm_t>(static_cast<size_t>(n), nullptr)};
    auto& comms = communicators.comms;
    std::vector<float*> send(n), recv(n);
    std::vector<cudaStream_t> streams(n);
    std::vector<cudaEvent_t> starts(n), ends(n);
    double expected = 0;
    for (int d = 0; d < n; ++d) {
      const std::string where = "GPU cuda:" + std::to_string(d);
      cuda_ok(cuda, cuda.cudaSetDevice(d), where + ": cudaSetDevice");
      void* p = nullptr;
      cuda_ok(cuda, scope.alloc(d, &p, max_bytes), where + ": cudaMalloc of the all-reduce input (" + bytes_text(max_bytes) + ")");
      send[d] = static_cast<float*>(p);
      cuda_ok(cuda, scope.alloc(d, &p, max_bytes), where + ": cudaMalloc of the all-reduce output (" + bytes_text(max_bytes) + ")");
      recv[d] = static_cast<float*>(p);
      cuda_ok(cuda, cuda.cudaMemset(send[d], pattern_byte(d), max_bytes), where + ": cudaMemset");
      cuda_ok(cuda, cuda.cudaMemset(recv[d], 0, max_bytes), where + ": cudaMemset");
      cuda_ok(cuda, scope.stream(d, &streams[d]), where + ": cudaStreamCreate");
      cuda_ok(cuda, scope.event(d, &starts[d]), where + ": cudaEventCreate");
      cuda_ok(cuda, scope.event(d, &ends[d]), where + ": cudaEventCreate");
      expected += float_of_byte(pattern_byte(d));
    }
    cuda_ok(cuda, cuda.cudaSetDevice(0), "cudaSetDevice(0)");

    std::vector<int> devlist(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) devlist[d] = d;
    if (ncclResult_t rc = nccl.ncclCommInitAll(comms.data(), n, devlist.data()); rc != ncclSuccess) {
      comms.assign(comms.size(), nullptr);
      throw CheckFailed("NCCL could not start on " + std::to_string(n) + " GPU(s): ncclCommInitAll: " +
                        nccl.describe(rc) + debug_hint(nccl.describe(rc)));
    }
    communicators.made = true;

    double busbw_sum = 0;
    for (size_t bytes_asked : plan.sizes) {
      const size_t count = std::max<size_t>(1, bytes_asked / sizeof(float));
      const size_t bytes = count * sizeof(float);
      auto all_reduce = [&](const char* phase) {
        ncclResult_t rc = nccl.ncclGroupStart();
        for (int d = 0; d < n && rc == ncclSuccess; ++d) {
          rc = nccl.ncclAllReduce(send[d], recv[d], count, ncclFloat32, ncclSum, comms[d], streams[d]);
        }
        ncclResult_t end_rc = nccl.ncclGroupEnd();
        if (rc == ncclSuccess) rc = end_rc;
        if (rc != ncclSuccess) {
          communicators.failed = true;
          throw CheckFailed(format("the NCCL all-reduce of %zu bytes failed (%s): ", bytes, phase) +
                            nccl.describe(rc) + debug_hint(nccl.describe(rc)));
        }
      };
      for (int i = 0; i < plan.warmup; ++i) all_reduce("warm-up");
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaEventRecord(starts[d], streams[d]), "cudaEventRecord");
      }
      for (int i = 0; i < plan.iters; ++i) all_reduce("timed");
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaEventRecord(ends[d], streams[d]), "cudaEventRecord");
      }
      float ms = 0;
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        ms = std::max(ms, elapsed_ms(cuda, starts[d], ends[d], "the all-reduce timing"));
      }

      // Every output element must be the sum of the devices' inputs: look at both ends.
      AllReduceRow row;
      const size_t probe = std::min<size_t>(count, 256);
      std::vector<float> host(probe);
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
        for (size_t offset : {size_t{0}, count - probe}) {
          cuda_ok(cuda, cuda.cudaMemcpy(host.data(), recv[d] + offset, probe * sizeof(float), cudaMemcpyDeviceToHost),
                  "cudaMemcpy device to host");
          for (float v : host) row.wrong += close_to(v, expected, 1e-4) ? 0 : 1;
          if (offset == count - probe && probe == count) break;  // both ends are the same
        }
      }
      row.bytes = bytes;
      row.count = count;
      row.time_us = ms * 1e3 / plan.iters;
      row.algbw_gbps = static_cast<double>(bytes) / (row.time_us * 1e-6) / 1e9;
      row.busbw_gbps = allreduce_busbw(row.algbw_gbps, n);
      busbw_sum += row.busbw_gbps;
      r.allreduce.push_back(row);
      if (row.wrong > 0) {
        r.problems.push_back(format("the NCCL all-reduce of %zu bytes gave wrong sums: %ld of the checked "
                                    "elements differ from %g",
                                    bytes, row.wrong, expected));
      }
    }
    r.allreduce_ran = true;
    if (!r.allreduce.empty()) r.avg_busbw_gbps = busbw_sum / static_cast<double>(r.allreduce.size());
    for (int d = 0; d < n; ++d) {
      cuda.cudaSetDevice(d);
      cuda.cudaStreamSynchronize(streams[d]);
    }
  } catch (const CheckFailed& e) {
    r.problems.push_back(e.what());
  }
}

void finish(DoctorReport& r, bool gpus_usable) {
  if (!gpus_usable) {
    r.exit_code = to_int(ExitCode::no_accelerator);
    r.summary = "No usable NVIDIA GPU on this node: " + no_gpu_reason(r) +
                ". airhost will run CPU ranks here (torch.distributed's gloo backend).";
    return;
  }
  if (!r.problems.empty()) {
    r.library_missing = std::all_of(r.problems.begin(), r.problems.end(), [&](const std::string& p) {
      return (!r.cudart.loaded && p == r.cudart.error) || (!r.nccl.loaded && p == r.nccl.error);
    });
    r.exit_code = to_int(ExitCode::preflight_failed);
    r.summary = std::to_string(r.problems.size()) + " check" + (r.problems.size() == 1 ? "" : "s") +
                " failed on " + std::to_string(r.gpus.size()) + " GPU(s): " + r.problems.front();
    return;
  }
  r.exit_code = to_int(ExitCode::ok);
  r.summary = format("All checks passed on %zu GPU(s)", r.gpus.size());
  if (!r.accelerator_type.empty()) r.summary += " (" + r.accelerator_type + ")";
  if (r.allreduce_ran && !r.allreduce.empty()) {
    const AllReduceRow& last = r.allreduce.back();
    const std::string at = bytes_text(static_cast<double>(last.bytes));
    if (r.allreduce_ranks == 1) {
      r.summary += format(": NCCL all-reduce algbw %.2f GB/s at %s (one GPU: busbw is 0)", last.algbw_gbps, at.c_str());
    } else {
      r.summary += format(": NCCL all-reduce busbw %.2f GB/s at %s", last.busbw_gbps, at.c_str());
    }
  }
  r.summary += ".";
}

// --- Output ---------------------------------------------------------------------------------

std::string q(const std::string& s) { return "\"" + json_escape(s) + "\""; }
std::string num(double v) { return std::isfinite(v) ? format("%.3f", v) : "null"; }
std::string boolean(bool b) { return b ? "true" : "false"; }

std::string json_library(const LibraryStatus& l) {
  return "{\"loaded\": " + boolean(l.loaded) + ", \"path\": " + q(l.path) + ", \"version\": " + q(l.version) +
         ", \"error\": " + q(l.error) + "}";
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + q(v[i]);
  return out + "]";
}

}  // namespace

std::vector<std::size_t> allreduce_sizes(const DoctorOptions& o) {
  if (!o.sizes.empty()) return o.sizes;
  if (o.quick) return {8, 64 << 10, 8 << 20, 64 << 20};
  // nccl-tests -b 8 -e 256M -f 4, plus the end itself (8 * 4^k skips 256 MiB).
  std::vector<std::size_t> sizes;
  const std::size_t end = std::size_t{256} << 20;
  for (std::size_t s = 8; s <= end; s *= 4) sizes.push_back(s);
  if (sizes.back() != end) sizes.push_back(end);
  return sizes;
}

double allreduce_busbw(double algbw, int ranks) {
  return ranks > 0 ? algbw * 2.0 * (ranks - 1) / ranks : 0.0;
}

std::string find_accelerators_toml() {
  if (const char* env = std::getenv("AIRHOST_ACCELERATORS_TOML"); env && *env) return env;
  std::vector<std::string> candidates;
  const std::string exe = executable_path();
  if (!exe.empty()) {
    const std::string prefix = dirname_of(dirname_of(exe));
    candidates.push_back(prefix + "/share/airhost/accelerators.toml");
#ifdef AIRHOST_PYTHON_VERSION
    // pip install: the binary in <env>/bin, the table in the package's configs/.
    candidates.push_back(prefix + "/lib/python" AIRHOST_PYTHON_VERSION "/site-packages/airhost/configs/accelerators.toml");
#endif
  }
  // The source tree this file (host/gpu/) was compiled from (a build tree's binary).
  candidates.push_back(dirname_of(dirname_of(dirname_of(__FILE__))) + "/configs/accelerators.toml");
  for (const auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return "";
}

DoctorReport run_doctor(const DoctorOptions& options) {
  DoctorReport r;
  const Plan plan = make_plan(options);
  r.warmup_iters = plan.warmup;
  r.iters = plan.iters;
  r.memory_bytes = plan.memory_bytes;
  r.copy_iters = plan.copy_iters;
  r.gemm_n = plan.gemm_n;
  r.gemm_iters = plan.gemm_iters;
  bool usable = false;
  try {
    usable = check_gpus(r);
    Cudart cuda;
    std::vector<int> gpu_of_device;
    if (usable && check_cuda_runtime(r, cuda, gpu_of_device)) {
      Cublas blas;
      const bool have_blas = load_cublas(r, blas);
      for (int d = 0; d < r.cuda_device_count; ++d) {
        DoctorGpu& g = r.gpus[gpu_of_device[d]];
        check_memory(r, cuda, d, g, plan);
        if (have_blas && g.memory_ok) check_gemm(r, cuda, blas, d, g, plan);
      }
      Nccl nccl;
      if (load_nccl(r, nccl)) check_allreduce(r, cuda, nccl, plan);
    }
    if (!usable && !options.quick) probe_libraries_without_gpu(r);
  } catch (const std::exception& e) {
    r.problems.push_back(std::string("the doctor itself failed: ") + e.what());
    usable = usable || !r.gpus.empty();
  }
  finish(r, usable);
  return r;
}

std::string doctor_text(const DoctorReport& r) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };

  if (r.exit_code == to_int(ExitCode::no_accelerator)) {
    line("No usable NVIDIA GPU on this node.");
    line("  Why: " + no_gpu_reason(r));
    if (r.nvml_loaded) {
      line("  NVIDIA driver " + r.driver_version + ", " + std::to_string(r.node_gpu_count) + " GPU(s) on the node.");
    }
    auto found = [](const LibraryStatus& l) {
      if (l.loaded) return (l.version.empty() ? std::string("?") : l.version) + " (" + l.path + ")";
      return l.error.find(" not found ") != std::string::npos ? std::string("not found") : l.error;
    };
    if (r.cudart.loaded || !r.cudart.error.empty()) {
      std::string cudart = found(r.cudart);
      if (!r.cuda_device_error.empty()) cudart += "; " + r.cuda_device_error;
      line("  CUDA runtime: " + cudart);
      line("  NCCL:         " + found(r.nccl));
      line("  cuBLAS:       " + found(r.cublas));
      if (!r.nvml_loaded && (r.cudart.loaded || r.nccl.loaded)) {
        line("  The CUDA libraries are here but no NVIDIA driver is. If this node has GPUs and this is a");
        line("  container, start it with them (docker run --gpus all; on Kubernetes, ask for nvidia.com/gpu).");
      }
    }
    line("  airhost will run CPU ranks here (torch.distributed's gloo backend): --accelerators N starts N");
    line("  of them, 1 by default.");
    line(format("airhost doctor: exit code %d (no accelerator)", r.exit_code));
    return out;
  }

  // GPUs
  line(format("NVIDIA driver %s (CUDA %s), %zu GPU(s) visible of %d on the node%s",
              r.driver_version.empty() ? "?" : r.driver_version.c_str(),
              r.cuda_driver_version.empty() ? "?" : r.cuda_driver_version.c_str(), r.gpus.size(),
              r.node_gpu_count,
              r.cuda_visible_devices_set ? (" (CUDA_VISIBLE_DEVICES=" + r.cuda_visible_devices + ")").c_str() : ""));
  size_t name_width = 4;
  for (const auto& g : r.gpus) name_width = std::max(name_width, g.name.size());
  line(format("  %-4s %-5s %-*s %10s  %-6s %s", "GPU", "CUDA", static_cast<int>(name_width), "Name", "Memory",
              "Model", "Bus ID"));
  for (const auto& g : r.gpus) {
    line(format("  %-4s %-5s %-*s %10s  %-6s %s", g.index < 0 ? "-" : std::to_string(g.index).c_str(),
                g.cuda_device < 0 ? "-" : std::to_string(g.cuda_device).c_str(), static_cast<int>(name_width),
                g.name.c_str(), format("%.1f GiB", g.memory_total / 1073741824.0).c_str(),
                g.model.empty() ? "?" : g.model.c_str(), g.pci_bus_id.empty() ? "?" : g.pci_bus_id.c_str()));
  }
  line("Accelerator type: " + (r.accelerator_type.empty() ? std::string("none in the table (see the notes)")
                                                          : r.accelerator_type));

  // Topology, as nvidia-smi topo -m.
  if (!r.topology.empty()) {
    line("");
    line("Topology (as nvidia-smi topo -m):");
    std::vector<std::string> labels;
    for (const auto& g : r.gpus) labels.push_back(g.index < 0 ? "?" : "GPU" + std::to_string(g.index));
    std::string header = format("%-8s", "");
    for (size_t j = 0; j < r.topology.size(); ++j) header += format("%-8s", labels[j].c_str());
    while (!header.empty() && header.back() == ' ') header.pop_back();
    line(header);
    for (size_t i = 0; i < r.topology.size(); ++i) {
      std::string row = format("%-8s", labels[i].c_str());
      for (const auto& cell : r.topology[i]) row += format("%-8s", cell.c_str());
      while (!row.empty() && row.back() == ' ') row.pop_back();
      line(row);
    }
    line("Legend:");
    line("  X    = Self");
    line("  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes");
    line("  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node");
    line("  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)");
    line("  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)");
    line("  PIX  = Connection traversing at most a single PCIe bridge");
    line("  NV#  = Connection traversing a bonded set of # NVLinks");
  }

  // Libraries
  line("");
  auto lib_line = [&](const char* name, const LibraryStatus& l) {
    if (l.loaded) {
      line(format("%-13s %s (%s)", name, l.version.empty() ? "?" : l.version.c_str(), l.path.c_str()));
    } else if (!l.error.empty()) {
      line(format("%-13s MISSING: %s", name, l.error.c_str()));
    } else {
      line(format("%-13s not checked", name));
    }
  };
  lib_line("CUDA runtime:", r.cudart);
  lib_line("NCCL:", r.nccl);
  lib_line("cuBLAS:", r.cublas);

  // Memory and compute
  bool any_memory = false;
  for (const auto& g : r.gpus) any_memory |= g.memory_checked;
  if (any_memory) {
    line("");
    line(format("Memory and compute per GPU (cudaMalloc %s, device-to-device copy x%d, FP32 SGEMM %d^3 x%d):",
                bytes_text(static_cast<double>(r.memory_bytes)).c_str(), r.copy_iters, r.gemm_n, r.gemm_iters));
    line(format("  %-4s %-6s %16s %16s", "GPU", "Memory", "Copy (GB/s)", "SGEMM (TFLOP/s)"));
    for (const auto& g : r.gpus) {
      if (!g.memory_checked) continue;
      std::string gemm = g.gemm_ran ? format("%.2f", g.gemm_tflops) : (g.gemm_error.empty() ? "skipped" : "FAILED");
      line(format("  %-4s %-6s %16s %16s", g.index < 0 ? "-" : std::to_string(g.index).c_str(),
                  g.memory_ok ? "ok" : "FAILED", g.memory_ok ? format("%.1f", g.copy_gbps).c_str() : "-",
                  gemm.c_str()));
    }
  }

  // All-reduce, as nccl-tests prints it.
  if (!r.allreduce.empty()) {
    line("");
    line(format("NCCL all-reduce across %d GPU(s) in this process (ncclCommInitAll; float sum, out of place; "
                "%d warm-up + %d timed iterations):",
                r.allreduce_ranks, r.warmup_iters, r.iters));
    line(format("#%12s %14s %9s %7s %10s %8s %8s %7s", "size", "count", "type", "redop", "time", "algbw", "busbw",
                "#wrong"));
    line(format("#%12s %14s %9s %7s %10s %8s %8s %7s", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""));
    for (const auto& row : r.allreduce) {
      line(format(" %12zu %14zu %9s %7s %10.2f %8.2f %8.2f %7ld", row.bytes, row.count, "float", "sum", row.time_us,
                  row.algbw_gbps, row.busbw_gbps, row.wrong));
    }
    line(format("# Avg bus bandwidth    : %.2f GB/s%s", r.avg_busbw_gbps,
                r.allreduce_ranks == 1 ? " (one GPU: busbw = algbw x 2(n-1)/n is 0; see algbw)" : ""));
  }

  if (!r.notes.empty()) {
    line("");
    for (const auto& n : r.notes) line("Note: " + n);
  }
  if (!r.problems.empty()) {
    line("");
    for (const auto& p : r.problems) line("FAILED: " + p);
  }
  line("");
  line("airhost doctor: " + r.summary);
  return out;
}

std::string doctor_json(const DoctorReport& r) {
  std::string o = "{";
  o += "\"exit_code\": " + std::to_string(r.exit_code);
  o += ", \"ok\": " + boolean(r.exit_code == 0);
  o += ", \"summary\": " + q(r.summary);
  o += ", \"problems\": " + json_strings(r.problems);
  o += ", \"notes\": " + json_strings(r.notes);
  o += ", \"nvml_loaded\": " + boolean(r.nvml_loaded);
  o += ", \"nvml_error\": " + q(r.nvml_error);
  o += ", \"driver_version\": " + q(r.driver_version);
  o += ", \"cuda_driver_version\": " + q(r.cuda_driver_version);
  o += ", \"node_gpu_count\": " + std::to_string(r.node_gpu_count);
  o += ", \"cuda_visible_devices\": " + (r.cuda_visible_devices_set ? q(r.cuda_visible_devices) : "null");
  o += ", \"accelerator_type\": " + (r.accelerator_type.empty() ? std::string("null") : q(r.accelerator_type));
  o += ", \"accelerators_toml\": " + q(r.accelerators_toml);
  o += ", \"gpus\": [";
  for (size_t i = 0; i < r.gpus.size(); ++i) {
    const auto& g = r.gpus[i];
    o += i ? ", {" : "{";
    o += "\"index\": " + std::to_string(g.index);
    o += ", \"cuda_device\": " + std::to_string(g.cuda_device);
    o += ", \"name\": " + q(g.name);
    o += ", \"uuid\": " + q(g.uuid);
    o += ", \"pci_bus_id\": " + q(g.pci_bus_id);
    o += ", \"memory_total\": " + std::to_string(g.memory_total);
    o += ", \"model\": " + q(g.model);
    o += ", \"memory_check\": {\"ran\": " + boolean(g.memory_checked) + ", \"ok\": " + boolean(g.memory_ok) +
         ", \"bytes\": " + std::to_string(g.memory_checked ? r.memory_bytes : 0) +
         ", \"copy_gbps\": " + num(g.copy_gbps) + ", \"error\": " + q(g.memory_error) + "}";
    o += ", \"compute_check\": {\"ran\": " + boolean(g.gemm_ran) + ", \"n\": " + std::to_string(r.gemm_n) +
         ", \"sgemm_tflops\": " + num(g.gemm_tflops) + ", \"error\": " + q(g.gemm_error) + "}";
    o += "}";
  }
  o += "]";
  o += ", \"topology\": {\"gpus\": [";
  for (size_t i = 0; i < r.topology.size() && i < r.gpus.size(); ++i) {
    o += (i ? ", " : "") + std::to_string(r.gpus[i].index);
  }
  o += "], \"matrix\": [";
  for (size_t i = 0; i < r.topology.size(); ++i) o += (i ? ", " : "") + json_strings(r.topology[i]);
  o += "]}";
  o += ", \"cuda_runtime\": " + json_library(r.cudart);
  o += ", \"cuda_device_count\": " + std::to_string(r.cuda_device_count);
  o += ", \"cuda_device_error\": " + q(r.cuda_device_error);
  o += ", \"nccl\": " + json_library(r.nccl);
  o += ", \"cublas\": " + json_library(r.cublas);
  o += ", \"allreduce\": {\"ran\": " + boolean(r.allreduce_ran) + ", \"ranks\": " + std::to_string(r.allreduce_ranks) +
       ", \"type\": \"float\", \"op\": \"sum\", \"warmup_iters\": " + std::to_string(r.warmup_iters) +
       ", \"iters\": " + std::to_string(r.iters) + ", \"rows\": [";
  for (size_t i = 0; i < r.allreduce.size(); ++i) {
    const auto& row = r.allreduce[i];
    o += (i ? ", " : "") + format("{\"size\": %zu, \"count\": %zu, \"time_us\": %s, \"algbw_gbps\": %s, "
                                  "\"busbw_gbps\": %s, \"wrong\": %ld}",
                                  row.bytes, row.count, num(row.time_us).c_str(), num(row.algbw_gbps).c_str(),
                                  num(row.busbw_gbps).c_str(), row.wrong);
  }
  o += "], \"avg_busbw_gbps\": " + num(r.avg_busbw_gbps) + "}";
  o += "}\n";
  return o;
}

DoctorOutcome run_doctor_in_child(const DoctorOptions& options, double timeout_seconds,
                                  const std::vector<int>& devices) {
  DoctorOutcome outcome;
  auto failed = [&](const std::string& why) {
    outcome.exit_code = to_int(ExitCode::preflight_failed);
    outcome.summary = why;
    outcome.problems.push_back(why);
    return outcome;
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return failed(std::string("cannot start the GPU check: pipe: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return failed(std::string("cannot start the GPU check: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    int code = to_int(ExitCode::preflight_failed);
    try {
      if (!devices.empty()) {
        std::string list;
        for (int d : devices) list += (list.empty() ? "" : ",") + std::to_string(d);
        ::setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
        ::setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
      }
      const DoctorReport report = run_doctor(options);
      // library_missing \0 summary \0 text \0 problem \0 problem \0 ...
      std::string message = std::string(report.library_missing ? "1" : "0") + '\0' + report.summary + '\0' +
                            doctor_text(report) + '\0';
      for (const auto& p : report.problems) message += p + '\0';
      write_all(fds[1], message);
      code = report.exit_code;
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(fds[1]);
  std::string data;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (timeout_seconds > 0 && left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int ready = ::poll(&p, 1, timeout_seconds > 0 ? static_cast<int>(std::min<long long>(left, 1000)) : 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return failed(format("the GPU check did not finish within %.0f s (a hung CUDA or NCCL call?); run "
                         "'airhost doctor' to see which check hangs",
                         timeout_seconds));
  }
  if (WIFSIGNALED(status)) {
    return failed("the GPU check crashed (" + signal_name(WTERMSIG(status)) +
                  "); run 'airhost doctor' to see which check crashes");
  }
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == '\0') {
      parts.push_back(data.substr(start, i - start));
      start = i + 1;
    }
  }
  if (parts.size() < 3) return failed("the GPU check ended without a report (exit status " +
                                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : to_int(ExitCode::preflight_failed);
  outcome.library_missing = parts[0] == "1";
  outcome.summary = parts[1];
  outcome.text = parts[2];
  outcome.problems.assign(parts.begin() + 3, parts.end());
  return outcome;
}

}  // namespace airhost::detail
