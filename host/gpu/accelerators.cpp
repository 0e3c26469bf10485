// accelerators.cpp — the GPUs of this node through NVML loaded with dlopen, narrowed by
// CUDA_VISIBLE_DEVICES as CUDA narrows them, and the GPUs handed to ranks.
//
// NVML is opened at run time, never linked: the same airhost binary must start on CPU-only
// nodes, where libnvidia-ml.so.1 does not exist. The few NVML declarations needed are
// written out in nvidia_api.hpp (checked against NVIDIA's nvml.h by tests/abi), so no header
// is needed at build time.
#include "gpu/accelerators.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <set>

#include "base/errors.hpp"
#include "base/util.hpp"
#include "gpu/nvml.hpp"

namespace airhost::detail {

namespace {

using namespace nvidia;

std::string trim(std::string_view s) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

// Like strtoul as CUDA applies it to an entry: an optional sign then digits, anything after
// the digits ignored ("1gpu" is 1). -1 when there are no digits, or for a negative number.
long long cuda_ordinal(const std::string& entry) {
  size_t i = 0;
  bool negative = false;
  if (i < entry.size() && (entry[i] == '+' || entry[i] == '-')) negative = entry[i++] == '-';
  size_t digits_start = i;
  long long value = 0;
  while (i < entry.size() && std::isdigit(static_cast<unsigned char>(entry[i]))) {
    if (value < 1'000'000) value = value * 10 + (entry[i] - '0');  // big is invalid anyway
    ++i;
  }
  if (i == digits_start) return -1;
  return negative && value != 0 ? -1 : value;
}

// Which of `all` CUDA would show under CUDA_VISIBLE_DEVICES=`spec`, in that order. The
// rules are the ones PyTorch documents its NVML-based device count with (it mirrors the
// CUDA driver, and the ranks run PyTorch): the first entry decides between a list of
// ordinals and a list of "GPU-" UUIDs; the first invalid entry ends the list (an ordinal
// out of range, a UUID prefix matching no GPU or several, an entry of the other kind);
// naming a GPU twice hides every GPU. MIG instances are not physical GPUs that airhost can
// hand to ranks; a "MIG-" list is reported through `note` and hides every GPU.
std::vector<GpuInfo> apply_cuda_visible_devices(const std::vector<GpuInfo>& all,
                                                const std::string& spec, std::string& note) {
  std::vector<GpuInfo> visible;
  std::set<int> seen;
  std::vector<std::string> entries = split(spec, ',');
  for (auto& e : entries) e = trim(e);
  const bool by_uuid = entries.front().rfind("GPU-", 0) == 0;
  if (entries.front().rfind("MIG-", 0) == 0) {
    note = "CUDA_VISIBLE_DEVICES names MIG instances (" + spec +
           "), which airhost cannot hand to ranks; no GPU is used";
    return {};
  }
  for (const auto& entry : entries) {
    int found = -1;
    if (by_uuid) {
      if (entry.rfind("GPU-", 0) != 0) break;
      int matches = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i].uuid.rfind(entry, 0) == 0) {
          ++matches;
          found = static_cast<int>(i);
        }
      }
      if (matches != 1) break;
    } else {
      long long ordinal = cuda_ordinal(entry);
      if (ordinal < 0 || ordinal >= static_cast<long long>(all.size())) break;
      found = static_cast<int>(ordinal);
    }
    if (!seen.insert(found).second) return {};
    visible.push_back(all[found]);
  }
  return visible;
}

AcceleratorInventory detect(const char* library, bool library_from_env) {
  AcceleratorInventory inv;
  Nvml nvml;
  if (std::string why = nvml.open(library, library_from_env); !why.empty()) {
    inv.nvml_error = why;
    return inv;
  }

  unsigned count = 0;
  nvmlReturn_t rc = nvml.nvmlDeviceGetCount_v2(&count);
  if (rc != NVML_SUCCESS) {
    inv.nvml_error = "NVML could not count the GPUs: " + nvml.describe(rc);
    return inv;
  }

  char buffer[std::max({NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
                        NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE})] = {};
  if (nvml.nvmlSystemGetDriverVersion(buffer, sizeof buffer) == NVML_SUCCESS) {
    inv.driver_version = std::string(buffer, strnlen(buffer, sizeof buffer));
  }

  // A GPU NVML cannot describe (fallen off the bus, say) keeps its place: indices and UUID
  // prefixes in CUDA_VISIBLE_DEVICES refer to NVML's full list.
  std::vector<GpuInfo> all;
  for (unsigned i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = static_cast<int>(i);
    nvmlDevice_t handle = nullptr;
    rc = nvml.nvmlDeviceGetHandleByIndex_v2(i, &handle);
    if (rc != NVML_SUCCESS) {
      gpu.name = "unknown GPU (" + nvml.describe(rc) + ")";
      all.push_back(std::move(gpu));
      continue;
    }
    std::memset(buffer, 0, sizeof buffer);
    rc = nvml.nvmlDeviceGetName(handle, buffer, NVML_DEVICE_NAME_V2_BUFFER_SIZE);
    gpu.name = rc == NVML_SUCCESS ? std::string(buffer, strnlen(buffer, sizeof buffer))
                                  : "unknown GPU (" + nvml.describe(rc) + ")";
    std::memset(buffer, 0, sizeof buffer);
    if (nvml.nvmlDeviceGetUUID(handle, buffer, NVML_DEVICE_UUID_V2_BUFFER_SIZE) == NVML_SUCCESS) {
      gpu.uuid = std::string(buffer, strnlen(buffer, sizeof buffer));
    }
    nvmlMemory_t memory{};
    if (nvml.nvmlDeviceGetMemoryInfo(handle, &memory) == NVML_SUCCESS) gpu.memory_total = memory.total;
    all.push_back(std::move(gpu));
  }

  inv.nvml_loaded = true;
  inv.node_gpu_count = static_cast<int>(all.size());
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  inv.gpus = cvd ? apply_cuda_visible_devices(all, cvd, inv.nvml_error) : std::move(all);
  return inv;
}
// "2 x NVIDIA H100 80GB HBM3, 1 x NVIDIA A10": a node's GPUs in a sentence.
std::string describe_gpus(const std::vector<GpuInfo>& gpus) {
  std::vector<std::pair<std::string, int>> groups;
  for (const auto& g : gpus) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& group) { return group.first == g.name; });
    if (it == groups.end()) {
      groups.emplace_back(g.name, 1);
    } else {
      ++it->second;
    }
  }
  std::string out;
  for (const auto& [name, n] : groups) {
    if (!out.empty()) out += ", ";
    out += std::to_string(n) + " x " + name;
  }
  return out;
}

}  // namespace

AcceleratorInventory detect_accelerators() {
  try {
    bool from_env = false;
    const char* library = nvml_library(&from_env);
    return detect(library, from_env);
  } catch (const std::exception& e) {
    AcceleratorInventory inv;
    inv.nvml_error = std::string("GPU detection failed: ") + e.what();
    return inv;
  }
}

int default_rank_count(const AcceleratorInventory& inv) {
  return inv.gpus.empty() ? 1 : static_cast<int>(inv.gpus.size());
}

std::vector<int> assign_devices(const AcceleratorInventory& inv, int requested) {
  if (requested < 1) {
    throw ConfigError("asked for " + std::to_string(requested) +
                      " accelerators; ask for at least 1, or leave it unset to use every "
                      "visible GPU");
  }
  if (inv.gpus.empty()) return {};
  const int visible = static_cast<int>(inv.gpus.size());
  if (requested > visible) {
    std::string msg = "asked for " + std::to_string(requested) +
                      " accelerators but this node has " + std::to_string(visible) +
                      " visible GPU" + (visible == 1 ? "" : "s") + " (" +
                      describe_gpus(inv.gpus) + "); ask for at most " + std::to_string(visible);
    if (inv.node_gpu_count > visible) {
      msg += ", or unset CUDA_VISIBLE_DEVICES, which hides " +
             std::to_string(inv.node_gpu_count - visible) + " of the node's " +
             std::to_string(inv.node_gpu_count) + " GPUs";
    }
    throw ConfigError(msg);
  }
  std::vector<int> indices;
  for (int i = 0; i < requested; ++i) indices.push_back(inv.gpus[i].index);
  return indices;
}

}  // namespace airhost::detail
