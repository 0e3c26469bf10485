// doctor_inventory.cpp — the doctor's first part, through NVML: the GPUs, their topology
// (as nvidia-smi topo -m), and the accelerator type the node maps to in accelerators.toml.
#include <cstdlib>
#include <exception>
#include <set>

#include "gpu/accelerator_types.hpp"
#include "gpu/accelerators.hpp"
#include "gpu/doctor_parts.hpp"
#include "gpu/topology.hpp"

namespace airhost::detail::doctor {

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

}  // namespace airhost::detail::doctor
