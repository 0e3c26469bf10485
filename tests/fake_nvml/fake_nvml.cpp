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
  if (g_init_refs == 0 && !load_gpus()) return NVML_ERROR_UNKNOWN;
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

FAKE_NVML_API int nvmlDeviceGetMemoryInfo(void* device, nvmlMemory_t* memory) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  FakeGpu* gpu = gpu_of(device);
  if (!gpu || !memory) return NVML_ERROR_INVALID_ARGUMENT;
  memory->total = gpu->mib * 1024ULL * 1024ULL;
  memory->free = memory->total;
  memory->used = 0;
  return NVML_SUCCESS;
}

FAKE_NVML_API int nvmlSystemGetDriverVersion(char* version, unsigned length) {
  if (g_init_refs == 0) return NVML_ERROR_UNINITIALIZED;
  return copy_out("0.0.0-airhost-fake-nvml", version, length);
}

FAKE_NVML_API const char* nvmlErrorString(int result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}
