// fake_nvml.cpp — A TEST FAKE, NOT NVIDIA's LIBRARY. It stands in for libnvidia-ml.so.1,
// the GPU driver's NVML library, which the machines that build and test airhost usually
// do not have. Tests point airhost at it with AIRHOST_NVML_LIBRARY=<path of
// libfake-nvidia-ml.so> and describe the GPUs it pretends to see:
//
//   AIRHOST_FAKE_NVML_GPUS="NAME:MIB:UUID;NAME:MIB:UUID;..."
//       e.g. "NVIDIA H100 80GB HBM3:81559:GPU-aaaa;NVIDIA H100 80GB HBM3:81559:GPU-bbbb".
//       Unset or empty: no GPU. The name may hold ':' (the last two fields are split off).
//   AIRHOST_FAKE_NVML_FAIL=1
//       nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a node whose driver
//       is installed but not running.
//   AIRHOST_FAKE_NVML_TOPOLOGY="X,NV4,SYS;NV4,X,PIX;SYS,PIX,X"
//       How the GPUs connect, one row per GPU as `nvidia-smi topo -m` prints it: NV<n> for
//       n NVLinks between the pair (P2P over NVLink OK, n active links), else PIX, PXB,
//       PHB, NODE or SYS (the PCIe common ancestor). Unset: every pair is PHB. The links of
//       a GPU go, in order, to each NV peer of its row, and report that peer's PCI address.
//   AIRHOST_FAKE_NVML_NVSWITCH=1
//       NVLinks end at an NVSwitch instead (as on an HGX board): each GPU has as many
//       active links as the largest NV<n> of its row, all reporting the switch's address.
//   AIRHOST_FAKE_NVML_CUDA_VERSION=12040
//       What nvmlSystemGetCudaDriverVersion_v2 reports (default 12040, i.e. CUDA 12.4).
//   AIRHOST_FAKE_NVML_USAGE=<file>
//       What each fake GPU is doing, read again at every call that asks (so a test, or a
//       rank pretending to use its GPU, can change it while a host keeps NVML open): lines
//       "util GPU PERCENT" (nvmlDeviceGetUtilizationRates; default 0) and "proc GPU PID BYTES"
//       (a process on that GPU, nvmlDeviceGetComputeRunningProcesses_v3). No file: idle GPUs
//       with no process.
//   PCI bus IDs are "00000000:<index + 1 in hex>:00.0" (the fake CUDA runtime agrees).
//
// Only the NVML calls airhost makes are here, with NVML's C signatures and return codes.
// The environment is read at each nvmlInit_v2, so one test process can change the fake
// GPUs between detections.
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int NVML_SUCCESS = 0;
constexpr int NVML_ERROR_UNINITIALIZED = 1;
constexpr int NVML_ERROR_INVALID_ARGUMENT = 2;
constexpr int NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr int NVML_ERROR_DRIVER_NOT_LOADED = 9;
constexpr int NVML_ERROR_UNKNOWN = 999;

constexpr int kMaxGpus = 64;

struct FakeGpu {
  char name[96];
  char uuid[96];
  unsigned long long mib;
};

FakeGpu g_gpus[kMaxGpus];
unsigned g_count = 0;

// nvmlGpuTopologyLevel_t, and the fake's topology matrix.
constexpr int NVML_ERROR_NOT_SUPPORTED = 3;
constexpr int NVML_TOPOLOGY_SINGLE = 10;
constexpr int NVML_TOPOLOGY_MULTIPLE = 20;
constexpr int NVML_TOPOLOGY_HOSTBRIDGE = 30;
constexpr int NVML_TOPOLOGY_NODE = 40;
constexpr int NVML_TOPOLOGY_SYSTEM = 50;
constexpr int NVML_P2P_STATUS_OK = 0;
constexpr int NVML_P2P_STATUS_NOT_SUPPORTED = 5;
constexpr unsigned NVML_NVLINK_MAX_LINKS = 18;

struct FakeLink {
  int level = NVML_TOPOLOGY_HOSTBRIDGE;  // PCIe common ancestor
  int nvlinks = 0;                       // NVLinks between the pair
};
FakeLink g_topo[kMaxGpus][kMaxGpus];
bool g_nvswitch = false;
int g_init_refs = 0;  // NVML counts nvmlInit calls; nvmlShutdown undoes one.

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

bool copy_field(char* dst, size_t dst_size, const char* begin, const char* end) {
  size_t n = static_cast<size_t>(end - begin);
  if (n == 0 || n >= dst_size) return false;
  std::memcpy(dst, begin, n);
  dst[n] = '\0';
  return true;
}

// One "NAME:MIB:UUID" entry, [begin, end).
bool parse_gpu(const char* begin, const char* end, FakeGpu* gpu) {
  const char* colon2 = nullptr;
  const char* colon1 = nullptr;
  for (const char* p = end; p > begin; --p) {
    if (p[-1] == ':') {
      if (!colon2) {
        colon2 = p - 1;
      } else {
        colon1 = p - 1;
        break;
      }
    }
  }
  if (!colon1 || !colon2) return false;
  char mib[32];
  if (!copy_field(gpu->name, sizeof gpu->name, begin, colon1) ||
      !copy_field(mib, sizeof mib, colon1 + 1, colon2) ||
      !copy_field(gpu->uuid, sizeof gpu->uuid, colon2 + 1, end)) {
    return false;
  }
  char* rest = nullptr;
  gpu->mib = std::strtoull(mib, &rest, 10);
  return rest && *rest == '\0';
}

bool load_gpus() {
  g_count = 0;
  const char* spec = std::getenv("AIRHOST_FAKE_NVML_GPUS");
  if (!spec || !*spec) return true;
  const char* begin = spec;
  while (true) {
    const char* end = std::strchr(begin, ';');
    if (!end) end = begin + std::strlen(begin);
    if (end > begin) {
      if (g_count == kMaxGpus || !parse_gpu(begin, end, &g_gpus[g_count])) {
        std::fprintf(stderr,
                     "fake NVML: AIRHOST_FAKE_NVML_GPUS entry '%.*s' is not NAME:MIB:UUID "
                     "(or more than %d GPUs)\n",
                     static_cast<int>(end - begin), begin, kMaxGpus);
        return false;
      }
      ++g_count;
    }
    if (*end == '\0') return true;
    begin = end + 1;
  }
}

// AIRHOST_FAKE_NVML_TOPOLOGY: "X,NV4;NV4,X" (rows ';', cells ',').
bool load_topology() {
  for (auto& row : g_topo)
    for (auto& cell : row) cell = FakeLink{};
  const char* nvswitch = std::getenv("AIRHOST_FAKE_NVML_NVSWITCH");
  g_nvswitch = nvswitch && std::strcmp(nvswitch, "1") == 0;
  const char* spec = std::getenv("AIRHOST_FAKE_NVML_TOPOLOGY");
  if (!spec || !*spec) return true;
  unsigned row = 0, col = 0;
  const char* p = spec;
  while (true) {
    size_t len = std::strcspn(p, ",;");
    char cell[16] = {};
    if (len == 0 || len >= sizeof cell || row >= g_count || col >= g_count) {
      std::fprintf(stderr, "fake NVML: AIRHOST_FAKE_NVML_TOPOLOGY '%s' is not a %u x %u matrix "
                   "of X, NV<n>, PIX, PXB, PHB, NODE, SYS\n", spec, g_count, g_count);
      return false;
    }
    std::memcpy(cell, p, len);
    FakeLink& link = g_topo[row][col];
    if (std::strncmp(cell, "NV", 2) == 0) {
      link.nvlinks = std::atoi(cell + 2);
      link.level = NVML_TOPOLOGY_NODE;
    } else if (std::strcmp(cell, "PIX") == 0) {
      link.level = NVML_TOPOLOGY_SINGLE;
    } else if (std::strcmp(cell, "PXB") == 0) {
      link.level = NVML_TOPOLOGY_MULTIPLE;
    } else if (std::strcmp(cell, "PHB") == 0) {
      link.level = NVML_TOPOLOGY_HOSTBRIDGE;
    } else if (std::strcmp(cell, "NODE") == 0) {
      link.level = NVML_TOPOLOGY_NODE;
    } else if (std::strcmp(cell, "SYS") == 0) {
      link.level = NVML_TOPOLOGY_SYSTEM;
    } else if (std::strcmp(cell, "X") != 0) {
      std::fprintf(stderr, "fake NVML: AIRHOST_FAKE_NVML_TOPOLOGY cell '%s' is not X, NV<n>, "
                   "PIX, PXB, PHB, NODE or SYS\n", cell);
      return false;
    }
    p += len;
    if (*p == ',') {
      ++col;
    } else {
      if (col + 1 != g_count) {
        std::fprintf(stderr, "fake NVML: AIRHOST_FAKE_NVML_TOPOLOGY row %u has %u cells, not %u\n",
                     row, col + 1, g_count);
        return false;
      }
      ++row;
      col = 0;
      if (*p == '\0') break;
    }
    ++p;
  }
  if (row != g_count) {
    std::fprintf(stderr, "fake NVML: AIRHOST_FAKE_NVML_TOPOLOGY has %u rows, not %u\n", row, g_count);
    return false;
  }
  return true;
}

void fake_bus_id(unsigned index, char* out, size_t size) {
  std::snprintf(out, size, "00000000:%02X:00.0", index + 1);
}

// The peer at the end of a GPU's link `link`: a GPU index, kMaxGpus for the NVSwitch, or -1
// for a link that is not there.
int link_peer(unsigned gpu, unsigned link) {
  unsigned first = 0;
  int widest = 0;
  for (unsigned peer = 0; peer < g_count; ++peer) {
    int n = peer == gpu ? 0 : g_topo[gpu][peer].nvlinks;
    if (n > widest) widest = n;
    if (!g_nvswitch && link < first + static_cast<unsigned>(n)) return static_cast<int>(peer);
    first += static_cast<unsigned>(n);
  }
  if (g_nvswitch && link < static_cast<unsigned>(widest)) return kMaxGpus;
  return -1;
}

int copy_out(const char* text, char* out, unsigned length) {
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  size_t n = std::strlen(text);
  if (n + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text, n + 1);
  return NVML_SUCCESS;
}

FakeGpu* gpu_of(void* device) {
  auto* gpu = static_cast<FakeGpu*>(device);
  if (gpu < g_gpus || gpu >= g_gpus + g_count) return nullptr;
  return gpu;
}

}  // namespace

#define FAKE_NVML_API extern "C" __attribute__((visibility("default")))

FAKE_NVML_API int nvmlInit_v2() {
  const char* fail = std::getenv("AIRHOST_FAKE_NVML_FAIL");
  if (fail && std::strcmp(fail, "1") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
  if (g_init_refs == 0 && (!load_gpus() || !load_topology())) return NVML_ERROR_UNKNOWN;
  ++g_init_refs;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlShutdown() {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init_refs;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetCount_v2(unsigned* count) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = g_count;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!device || index >= g_count) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &g_gpus[index];
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetName(void* device, char* name, unsigned length) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  return gpu ? copy_out(gpu->name, name, length) : NVML_ERROR_INVALID_ARGUMENT;
}

FAKE_NVML_API int nvmlDeviceGetUUID(void* device, char* uuid, unsigned length) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  return gpu ? copy_out(gpu->uuid, uuid, length) : NVML_ERROR_INVALID_ARGUMENT;
}

namespace {
unsigned long long used_bytes(unsigned gpu);  // what AIRHOST_FAKE_NVML_USAGE's processes hold on it
}

FAKE_NVML_API int nvmlDeviceGetMemoryInfo(void* device, nvmlMemory_t* memory) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !memory) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = gpu->mib * 1024ULL * 1024ULL;
  memory->used = used_bytes(static_cast<unsigned>(gpu - g_gpus));
  memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlSystemGetDriverVersion(char* version, unsigned length) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  return copy_out("0.0.0-airhost-fake-nvml", version, length);
}

// nvmlPciInfo_t of nvml.h (the _v3 call's layout).
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char busId[32];
};

FAKE_NVML_API int nvmlSystemGetCudaDriverVersion_v2(int* version) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  if (!version) return NVML_ERROR_INVALID_ARGUMENT;
  const char* v = std::getenv("AIRHOST_FAKE_NVML_CUDA_VERSION");
  *version = v && *v ? std::atoi(v) : 12040;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetPciInfo_v3(void* device, nvmlPciInfo_t* pci) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !pci) return NVML_ERROR_INVALID_ARGUMENT;
  std::memset(pci, 0, sizeof *pci);
  const unsigned index = static_cast<unsigned>(gpu - g_gpus);
  pci->bus = index + 1;
  fake_bus_id(index, pci->busId, sizeof pci->busId);
  std::snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", index + 1);
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetTopologyCommonAncestor(void* device1, void* device2, int* level) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* a = gpu_of(device1);
  FakeGpu* b = gpu_of(device2);
  if (!a || !b || !level) return NVML_ERROR_INVALID_ARGUMENT;
  *level = g_topo[a - g_gpus][b - g_gpus].level;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetP2PStatus(void* device1, void* device2, int caps_index, int* status) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* a = gpu_of(device1);
  FakeGpu* b = gpu_of(device2);
  if (!a || !b || !status || caps_index < 0 || caps_index > 4) return NVML_ERROR_INVALID_ARGUMENT;
  const bool nvlink = a != b && g_topo[a - g_gpus][b - g_gpus].nvlinks > 0;
  // Index 2 is NVML_P2P_CAPS_INDEX_NVLINK; the others (read, write, atomics, PCI) are OK.
  *status = caps_index != 2 || nvlink ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetNvLinkState(void* device, unsigned link, int* is_active) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !is_active || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
  *is_active = link_peer(static_cast<unsigned>(gpu - g_gpus), link) >= 0 ? 1 : 0;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* device, unsigned link, nvmlPciInfo_t* pci) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !pci || link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
  const int peer = link_peer(static_cast<unsigned>(gpu - g_gpus), link);
  if (peer < 0) return NVML_ERROR_NOT_SUPPORTED;
  std::memset(pci, 0, sizeof *pci);
  if (peer == kMaxGpus) {
    std::snprintf(pci->busId, sizeof pci->busId, "00000000:C0:00.0");  // the NVSwitch
  } else {
    fake_bus_id(static_cast<unsigned>(peer), pci->busId, sizeof pci->busId);
  }
  return NVML_SUCCESS;
}

namespace {

struct nvmlUtilization_t {
  unsigned gpu;
  unsigned memory;
};
struct nvmlProcessInfo_t {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
};

// Calls `line(kind, gpu, a, b)` for each line of AIRHOST_FAKE_NVML_USAGE.
template <typename F>
void read_usage(F line) {
  const char* path = std::getenv("AIRHOST_FAKE_NVML_USAGE");
  if (!path || !*path) return;
  std::FILE* f = std::fopen(path, "r");
  if (!f) return;
  char kind[8];
  unsigned gpu;
  unsigned long long a, b;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f)) {
    const int n = std::sscanf(buf, "%7s %u %llu %llu", kind, &gpu, &a, &b);
    if (n >= 3) line(kind, gpu, a, n == 4 ? b : 0ULL);
  }
  std::fclose(f);
}

unsigned long long used_bytes(unsigned gpu) {
  unsigned long long sum = 0;
  read_usage([&](const char* kind, unsigned g, unsigned long long, unsigned long long bytes) {
    if (std::strcmp(kind, "proc") == 0 && g == gpu) sum += bytes;
  });
  return sum;
}

}  // namespace

FAKE_NVML_API int nvmlDeviceGetUtilizationRates(void* device, nvmlUtilization_t* util) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !util) return NVML_ERROR_INVALID_ARGUMENT;
  const unsigned index = static_cast<unsigned>(gpu - g_gpus);
  util->gpu = util->memory = 0;
  read_usage([&](const char* kind, unsigned g, unsigned long long a, unsigned long long) {
    if (std::strcmp(kind, "util") == 0 && g == index) util->gpu = util->memory = static_cast<unsigned>(a);
  });
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count, nvmlProcessInfo_t* infos) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !count) return NVML_ERROR_INVALID_ARGUMENT;
  const unsigned index = static_cast<unsigned>(gpu - g_gpus);
  unsigned found = 0;
  const unsigned room = infos ? *count : 0;
  read_usage([&](const char* kind, unsigned g, unsigned long long pid, unsigned long long bytes) {
    if (std::strcmp(kind, "proc") != 0 || g != index) return;
    if (found < room) infos[found] = {static_cast<unsigned>(pid), bytes, 0xFFFFFFFFu, 0xFFFFFFFFu};
    ++found;
  });
  *count = found;
  return found > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

FAKE_NVML_API const char* nvmlErrorString(int result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

// Each entry point airhost resolves takes the calls airhost makes (host/gpu/nvidia_api.hpp, itself
// checked against NVIDIA's headers by tests/abi/check_gpu_abi.cpp).
#include "abi_compat.hpp"
#include "gpu/nvidia_api.hpp"
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlInit_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlShutdown);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlErrorString);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetCount_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetHandleByIndex_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetName);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetUUID);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetMemoryInfo);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlSystemGetDriverVersion);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlSystemGetCudaDriverVersion_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetPciInfo_v3);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetP2PStatus);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetNvLinkState);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetNvLinkRemotePciInfo_v2);
AIRHOST_CHECK_AGAINST_GPU_ABI(nvmlDeviceGetTopologyCommonAncestor);
