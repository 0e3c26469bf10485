// accelerators.cpp — GPU inventory through NVML loaded with dlopen, and the accelerator
// type table.
//
// NVML is opened at run time, never linked: the same airhost binary must start on CPU-only
// nodes, where libnvidia-ml.so.1 does not exist. The few NVML declarations needed are
// written out in nvidia_api.hpp (checked against NVIDIA's nvml.h by tests/abi), so no header
// is needed at build time.
#include "gpu/accelerators.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "config.hpp"
#include "gpu/nvidia_api.hpp"

namespace airhost::detail {

namespace {

using namespace nvidia;

constexpr const char* kDefaultNvml = "libnvidia-ml.so.1";

struct Nvml : NvmlApi {
  void* lib = nullptr;
  bool initialized = false;

  Nvml() = default;
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  // Unloading matters: tests open different libraries in one process, and a long-lived
  // Python process should not keep the driver's library mapped for one query.
  ~Nvml() {
    if (initialized && nvmlShutdown) nvmlShutdown();
    if (lib) dlclose(lib);
  }

  std::string describe(nvmlReturn_t rc) const {
    const char* text = nvmlErrorString ? nvmlErrorString(rc) : nullptr;
    std::string out = text && *text ? text : "unknown error";
    return out + " (NVML error " + std::to_string(rc) + ")";
  }
};

std::string trim(std::string_view s) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? s.npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
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
  nvml.lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!nvml.lib) {
    const char* why = dlerror();
    std::string reason = why ? why : "unknown dlopen error";
    if (library_from_env) {
      inv.nvml_error = "AIRHOST_NVML_LIBRARY=" + std::string(library) +
                       " could not be loaded: " + reason;
    } else if (reason.find("No such file") != std::string::npos ||
               reason.find("cannot open shared object") != std::string::npos) {
      inv.nvml_error = std::string(library) + " not found: no NVIDIA driver on this node";
    } else {
      inv.nvml_error = std::string(library) + " could not be loaded: " + reason;
    }
    return inv;
  }

  if (const char* missing = resolve(nvml.lib, nvml)) {
    inv.nvml_error = std::string(library) + " lacks " + missing +
                     ": the NVIDIA driver is too old or the library is not NVML";
    return inv;
  }

  nvmlReturn_t rc = nvml.nvmlInit_v2();
  if (rc != NVML_SUCCESS) {
    inv.nvml_error = "NVML did not start: " + nvml.describe(rc) +
                     "; the NVIDIA driver may not be loaded on this node";
    return inv;
  }
  nvml.initialized = true;

  unsigned count = 0;
  rc = nvml.nvmlDeviceGetCount_v2(&count);
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

// --- accelerators.toml --------------------------------------------------------------------

std::string where(const std::string& path, const toml::source_region& region) {
  return path + ":" + std::to_string(region.begin.line) + ":" +
         std::to_string(region.begin.column) + ": ";
}

// Upper-cased tokens of an NVML name or a `match` entry: split at spaces and '-', the two
// separators NVML names use ("NVIDIA A100-SXM4-80GB").
std::vector<std::string> name_tokens(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (char c : text) {
    if (c == '-' || std::isspace(static_cast<unsigned char>(c))) {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
    } else {
      current += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

bool tokens_match(const std::vector<std::string>& name, const std::vector<std::string>& pattern) {
  if (pattern.empty() || pattern.size() > name.size()) return false;
  return std::search(name.begin(), name.end(), pattern.begin(), pattern.end()) != name.end();
}

}  // namespace

AcceleratorInventory detect_accelerators() {
  try {
    const char* from_env = std::getenv("AIRHOST_NVML_LIBRARY");
    const bool use_env = from_env && *from_env;
    return detect(use_env ? from_env : kDefaultNvml, use_env);
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

std::vector<AcceleratorType> load_accelerator_types(const std::string& toml_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(toml_path, ec)) {
    throw ConfigError("accelerator type table " + toml_path +
                      " does not exist or is not a file; reinstall airhost");
  }
  toml::table root;
  try {
    root = toml::parse_file(toml_path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(toml_path, e.source()) + std::string(e.description()));
  }

  for (auto&& [key, node] : root) {
    if (key.str() != "type") {
      throw ConfigError(where(toml_path, key.source()) + "unknown key '" +
                        std::string(key.str()) + "'; the file holds only [[type]] tables");
    }
  }
  const toml::array* rows = root["type"].as_array();
  if (!rows || !rows->is_array_of_tables() || rows->empty()) {
    throw ConfigError(toml_path + ":1:1: no [[type]] tables; see the format at the top of "
                      "configs/accelerators.toml");
  }

  std::vector<AcceleratorType> types;
  std::set<std::string> names;
  std::map<std::string, std::vector<std::string>> match_of_gpu;
  for (const toml::node& row_node : *rows) {
    const toml::table& row = *row_node.as_table();
    const std::string at = where(toml_path, row.source());
    for (auto&& [key, value] : row) {
      static const std::set<std::string_view> known = {"name", "gpu", "count", "match"};
      if (!known.count(key.str())) {
        throw ConfigError(where(toml_path, key.source()) + "unknown key '" +
                          std::string(key.str()) + "'; a [[type]] has name, gpu, count, match");
      }
    }
    auto text = [&](const char* key) {
      const toml::node* n = row.get(key);
      if (!n || !n->is_string() || n->as_string()->get().empty()) {
        throw ConfigError((n ? where(toml_path, n->source()) : at) + "key '" + key +
                          "' must be a non-empty string");
      }
      return n->as_string()->get();
    };
    AcceleratorType t;
    t.name = text("name");
    t.gpu = text("gpu");
    const toml::node* count = row.get("count");
    if (!count || !count->is_integer() || count->as_integer()->get() < 1 ||
        count->as_integer()->get() > 1024) {
      throw ConfigError((count ? where(toml_path, count->source()) : at) + "type '" + t.name +
                        "': key 'count' must be an integer from 1 to 1024");
    }
    t.count = static_cast<int>(count->as_integer()->get());
    const toml::node* match = row.get("match");
    const toml::array* match_array = match ? match->as_array() : nullptr;
    if (!match_array || match_array->empty()) {
      throw ConfigError((match ? where(toml_path, match->source()) : at) + "type '" + t.name +
                        "': key 'match' must be a non-empty array of strings");
    }
    for (const toml::node& m : *match_array) {
      if (!m.is_string() || name_tokens(m.as_string()->get()).empty()) {
        throw ConfigError(where(toml_path, m.source()) + "type '" + t.name +
                          "': every 'match' entry must be a string with a name token in it");
      }
      t.match.push_back(m.as_string()->get());
    }
    // The name is what users type; a count or model that disagrees with it would launch
    // the wrong number of ranks without a word.
    const std::string expected = "GPU_" + std::to_string(t.count) + "x" + t.gpu;
    if (t.name != expected) {
      throw ConfigError(at + "type '" + t.name + "' has gpu = \"" + t.gpu + "\" and count = " +
                        std::to_string(t.count) + ", so its name must be '" + expected + "'");
    }
    if (!names.insert(t.name).second) {
      throw ConfigError(at + "type '" + t.name + "' is defined twice");
    }
    auto [it, inserted] = match_of_gpu.emplace(t.gpu, t.match);
    if (!inserted && it->second != t.match) {
      throw ConfigError(at + "type '" + t.name + "': its 'match' differs from that of an "
                        "earlier type with gpu = \"" + t.gpu + "\"; the same model must match "
                        "the same names");
    }
    types.push_back(std::move(t));
  }
  return types;
}

std::optional<std::string> gpu_model_of(const std::vector<AcceleratorType>& types,
                                        const std::string& nvml_name) {
  const std::vector<std::string> name = name_tokens(nvml_name);
  for (const auto& t : types) {
    for (const auto& m : t.match) {
      if (tokens_match(name, name_tokens(m))) return t.gpu;
    }
  }
  return std::nullopt;
}

}  // namespace airhost::detail

// --- Topology, for `airhost doctor` -------------------------------------------------------

namespace airhost::detail {

namespace {

const char* pcie_label(int level) {
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:  // the same board
    case NVML_TOPOLOGY_SINGLE: return "PIX";
    case NVML_TOPOLOGY_MULTIPLE: return "PXB";
    case NVML_TOPOLOGY_HOSTBRIDGE: return "PHB";
    case NVML_TOPOLOGY_NODE: return "NODE";
    case NVML_TOPOLOGY_SYSTEM: return "SYS";
    default: return "?";
  }
}


}  // namespace

std::string cuda_version_string(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

GpuTopology detect_topology(const AcceleratorInventory& inv) {
  GpuTopology topo;
  const size_t n = inv.gpus.size();
  topo.pci_bus_ids.assign(n, "");
  topo.links.assign(n, std::vector<std::string>(n, "?"));
  topo.nvlinks.assign(n, std::vector<int>(n, 0));
  for (size_t i = 0; i < n; ++i) topo.links[i][i] = "X";

  const char* from_env = std::getenv("AIRHOST_NVML_LIBRARY");
  const char* library = from_env && *from_env ? from_env : kDefaultNvml;
  Nvml nvml;
  nvml.lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!nvml.lib) {
    const char* why = dlerror();
    topo.error = std::string(library) + " could not be loaded: " + (why ? why : "unknown error");
    return topo;
  }
  resolve(nvml.lib, nvml);  // what the topology needs is checked here, the rest is optional
  if (!nvml.nvmlInit_v2 || !nvml.nvmlShutdown || !nvml.nvmlDeviceGetHandleByIndex_v2) {
    topo.error = std::string(library) + " lacks the NVML device calls";
    return topo;
  }
  nvmlReturn_t rc = nvml.nvmlInit_v2();
  if (rc != NVML_SUCCESS) {
    topo.error = "NVML did not start: " + nvml.describe(rc);
    return topo;
  }
  nvml.initialized = true;

  int cuda_version = 0;
  if (nvml.nvmlSystemGetCudaDriverVersion_v2 && nvml.nvmlSystemGetCudaDriverVersion_v2(&cuda_version) == NVML_SUCCESS) {
    topo.cuda_driver_version = cuda_version_string(cuda_version);
  }

  std::vector<nvmlDevice_t> handles(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    if (nvml.nvmlDeviceGetHandleByIndex_v2(static_cast<unsigned>(inv.gpus[i].index), &handles[i]) != NVML_SUCCESS) {
      handles[i] = nullptr;
      continue;
    }
    nvmlPciInfo_t pci{};
    if (nvml.nvmlDeviceGetPciInfo_v3 && nvml.nvmlDeviceGetPciInfo_v3(handles[i], &pci) == NVML_SUCCESS) {
      topo.pci_bus_ids[i] = std::string(pci.busId, strnlen(pci.busId, sizeof pci.busId));
    }
  }

  // Each GPU's active links, and the PCI address at the other end of each when NVML says.
  std::vector<int> active(n, 0);
  std::vector<std::vector<std::string>> remote(n);
  for (size_t i = 0; i < n; ++i) {
    if (!handles[i] || !nvml.nvmlDeviceGetNvLinkState) continue;
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      int state = 0;
      if (nvml.nvmlDeviceGetNvLinkState(handles[i], link, &state) != NVML_SUCCESS ||
          state != NVML_FEATURE_ENABLED) {
        continue;
      }
      ++active[i];
      nvmlPciInfo_t pci{};
      if (nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2 && nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handles[i], link, &pci) == NVML_SUCCESS) {
        remote[i].emplace_back(pci.busId, strnlen(pci.busId, sizeof pci.busId));
      }
    }
  }

  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j || !handles[i] || !handles[j]) continue;
      int p2p = -1;
      const bool nvlink = nvml.nvmlDeviceGetP2PStatus &&
                          nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], NVML_P2P_CAPS_INDEX_NVLINK,
                                           &p2p) == NVML_SUCCESS &&
                          p2p == NVML_P2P_STATUS_OK;
      if (nvlink) {
        // Links that end at GPU j itself; none means they end at an NVSwitch, through which
        // every link of the pair reaches the peer (nvidia-smi shows NV18 on an HGX H100).
        int direct = 0;
        if (!topo.pci_bus_ids[j].empty()) {
          for (const auto& r : remote[i]) direct += same_pci_device(r, topo.pci_bus_ids[j]) ? 1 : 0;
        }
        const int count = direct > 0 ? direct : std::min(active[i], active[j]);
        topo.nvlinks[i][j] = count;
        topo.links[i][j] = count > 0 ? "NV" + std::to_string(count) : "NV?";
        continue;
      }
      int level = -1;
      if (nvml.nvmlDeviceGetTopologyCommonAncestor &&
          nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j], &level) == NVML_SUCCESS) {
        topo.links[i][j] = pcie_label(level);
      }
    }
  }
  return topo;
}

// "00000000:3B:00.0" and "0000:3b:00.0" name the same device: compare domain, bus, device
// and function as numbers.
bool same_pci_device(const std::string& a, const std::string& b) {
  auto parse = [](const std::string& s, unsigned long out[4]) {
    unsigned n = 0;
    const char* p = s.c_str();
    while (n < 4 && *p) {
      char* end = nullptr;
      out[n++] = std::strtoul(p, &end, 16);
      if (end == p) return false;
      p = end;
      if (*p == ':' || *p == '.') ++p;
    }
    return n == 4;
  };
  unsigned long x[4], y[4];
  return parse(a, x) && parse(b, y) && std::equal(x, x + 4, y);
}

}  // namespace airhost::detail
