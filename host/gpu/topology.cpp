// topology.cpp — how the visible GPUs connect, through NVML: the matrix `nvidia-smi topo -m`
// prints (NVLinks, else the PCIe path), and PCI bus ids for matching NVML's GPUs to CUDA's.
#include "gpu/topology.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gpu/libraries.hpp"
#include "gpu/nvml.hpp"

namespace airhost::detail {

namespace {

using namespace nvidia;

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

GpuTopology detect_topology(const AcceleratorInventory& inv) {
  GpuTopology topo;
  const size_t n = inv.gpus.size();
  topo.pci_bus_ids.assign(n, "");
  topo.links.assign(n, std::vector<std::string>(n, "?"));
  topo.nvlinks.assign(n, std::vector<int>(n, 0));
  for (size_t i = 0; i < n; ++i) topo.links[i][i] = "X";

  const char* library = nvml_library();
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
