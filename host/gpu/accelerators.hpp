// accelerators.hpp — what GPUs this node has, through NVML loaded at run time.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace airhost::detail {

struct GpuInfo {
  int index = 0;             // NVML index (physical order)
  std::string name;          // "NVIDIA H100 80GB HBM3"
  std::string uuid;          // "GPU-…"
  unsigned long long memory_total = 0;  // bytes
};

struct AcceleratorInventory {
  bool nvml_loaded = false;     // false: no driver / library; gpus is empty
  std::string nvml_error;       // why NVML could not be used, when it couldn't
  std::string driver_version;
  std::vector<GpuInfo> gpus;    // the GPUs this process may use, after CUDA_VISIBLE_DEVICES
  int node_gpu_count = 0;       // every GPU NVML lists, before CUDA_VISIBLE_DEVICES
};

// Loads libnvidia-ml.so.1 (or $AIRHOST_NVML_LIBRARY, which the tests point at a fake)
// with dlopen, and lists the GPUs visible under CUDA_VISIBLE_DEVICES (indices or UUIDs,
// "" or "-1" hides all). Never throws; a node without NVML is a node without GPUs.
AcceleratorInventory detect_accelerators();

// The rank count to use when the user gave none: the visible GPUs, or 1 without any.
int default_rank_count(const AcceleratorInventory& inv);

// For `requested` ranks: the NVML indices to give local ranks 0..requested-1, or an empty
// vector for CPU ranks (no GPU on the node). Throws ConfigError when more GPUs are asked
// for than are visible, naming both numbers, and when requested < 1.
std::vector<int> assign_devices(const AcceleratorInventory& inv, int requested);

// One row of configs/accelerators.toml: a Databricks accelerator type name.
struct AcceleratorType {
  std::string name;                 // "GPU_8xH100"
  std::string gpu;                  // "H100": the model short name
  int count = 0;                    // GPUs (ranks) of that type: 8
  std::vector<std::string> match;   // NVML name tokens that identify the model: {"H100"}
};

// Reads and checks the table (format documented at the top of configs/accelerators.toml).
// Throws ConfigError "FILE:LINE:COLUMN: ..." for a bad file.
std::vector<AcceleratorType> load_accelerator_types(const std::string& toml_path);

// The model short name ("H100") of an NVML device name ("NVIDIA H100 80GB HBM3"): the `gpu`
// of the first type, in file order, one of whose `match` entries matches the name by whole
// tokens (see the file). std::nullopt for a model the table does not know.
std::optional<std::string> gpu_model_of(const std::vector<AcceleratorType>& types,
                                        const std::string& nvml_name);

}  // namespace airhost::detail

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

// "12.4" from a CUDA version number as NVML and the CUDA runtime give it (12040).
std::string cuda_version_string(int version);

// True when two PCI bus ids name one device ("00000000:3B:00.0" == "0000:3b:00.0"):
// NVML and CUDA spell them differently.
bool same_pci_device(const std::string& a, const std::string& b);

}  // namespace airhost::detail
