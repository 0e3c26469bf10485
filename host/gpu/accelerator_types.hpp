// accelerator_types.hpp — the accelerator type table, configs/accelerators.toml: the
// Databricks accelerator type names (GPU_8xH100), and which GPU model an NVML name is.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace airhost::detail {

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

// The accelerator table: $AIRHOST_ACCELERATORS_TOML, else next to the binary
// (../share/airhost/accelerators.toml, then the pip layout), else the source tree's
// configs/accelerators.toml. "" when none exists.
std::string find_accelerators_toml();

}  // namespace airhost::detail
