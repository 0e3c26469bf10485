// topology.hpp — how the visible GPUs connect, as `nvidia-smi topo -m` shows it, for
// `airhost doctor`.
#pragma once

#include <string>
#include <vector>

#include "gpu/accelerators.hpp"

namespace airhost::detail {

// What NVML says about how the visible GPUs connect, for `airhost doctor`. Every field is
// best effort: a driver too old for a call leaves that part empty or "?", never an error.
struct GpuTopology {
  std::string cuda_driver_version;      // "12.4": nvmlSystemGetCudaDriverVersion_v2; "" unknown
  std::vector<std::string> pci_bus_ids;  // per inv.gpus entry: "00000000:3B:00.0"; "" unknown
  // [i][j] over inv.gpus, as `nvidia-smi topo -m` prints it: "X" on the diagonal, "NV<n>"
  // for n bonded NVLinks, else PIX, PXB, PHB, NODE or SYS (the PCIe path), "?" if unknown.
  std::vector<std::vector<std::string>> links;
  std::vector<std::vector<int>> nvlinks;  // [i][j]: the NVLinks in links[i][j], 0 without
  std::string error;                      // why NVML could not be asked, "" when it could
};

// Opens NVML again ($AIRHOST_NVML_LIBRARY or libnvidia-ml.so.1) and reads the topology of
// `inv.gpus`: P2P status over NVLink (nvmlDeviceGetP2PStatus), active links
// (nvmlDeviceGetNvLinkState; a link to an NVSwitch counts for every peer, as in nvidia-smi)
// and the closest common PCIe ancestor (nvmlDeviceGetTopologyCommonAncestor). Never throws.
GpuTopology detect_topology(const AcceleratorInventory& inv);

// True when two PCI bus ids name one device ("00000000:3B:00.0" == "0000:3b:00.0"):
// NVML and CUDA spell them differently.
bool same_pci_device(const std::string& a, const std::string& b);

}  // namespace airhost::detail
