// GPU detection against a FAKE NVML (tests/fake_nvml: libfake-nvidia-ml.so, a test stand-in
// for the NVIDIA driver's library, which build machines don't have), and the accelerator
// type table.
#include <doctest/doctest.h>

#include "support.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "gpu/accelerator_types.hpp"
#include "gpu/accelerators.hpp"
#include "cli/config.hpp"

#ifndef AIRHOST_FAKE_NVML_PATH
#error "AIRHOST_FAKE_NVML_PATH must name libfake-nvidia-ml.so (tests/fake_nvml/CMakeLists.txt)"
#endif

using namespace airhost::detail;

using airhost_test::ScopedEnv;

namespace {

const char* const kTwoH100 =
    "NVIDIA H100 80GB HBM3:81559:GPU-aaaa1111-0000-0000-0000-000000000000;"
    "NVIDIA H100 80GB HBM3:81559:GPU-bbbb2222-0000-0000-0000-000000000000";

const char* const kFourMixed =
    "NVIDIA A10:23028:GPU-1111aaaa;"
    "NVIDIA A100-SXM4-80GB:81920:GPU-1112bbbb;"
    "NVIDIA H100 80GB HBM3:81559:GPU-2222cccc;"
    "NVIDIA H200:143771:GPU-3333dddd";


// A node with the fake NVML and these GPUs; CUDA_VISIBLE_DEVICES unset unless given.
struct FakeNode {
  ScopedEnv env;
  explicit FakeNode(const char* gpus, std::optional<std::string> cuda_visible = std::nullopt) {
    env.set("AIRHOST_NVML_LIBRARY", AIRHOST_FAKE_NVML_PATH)
        .set("AIRHOST_FAKE_NVML_GPUS", gpus)
        .set("AIRHOST_FAKE_NVML_FAIL", std::nullopt)
        .set("CUDA_VISIBLE_DEVICES", cuda_visible);
  }
};

std::vector<int> indices_of(const AcceleratorInventory& inv) {
  std::vector<int> out;
  for (const auto& g : inv.gpus) out.push_back(g.index);
  return out;
}

std::vector<int> visible_under(const char* cuda_visible_devices) {
  FakeNode node(kFourMixed, cuda_visible_devices);
  AcceleratorInventory inv = detect_accelerators();
  REQUIRE(inv.nvml_loaded);
  CHECK(inv.node_gpu_count == 4);
  return indices_of(inv);
}

std::string assign_error(const AcceleratorInventory& inv, int requested) {
  try {
    assign_devices(inv, requested);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string table_path() { return std::string(AIRHOST_SOURCE_DIR) + "/configs/accelerators.toml"; }

// A TOML file with `text`, removed at the end of the test.
struct TempToml {
  std::filesystem::path path;
  explicit TempToml(const std::string& text) {
    path = std::filesystem::temp_directory_path() /
           ("airhost-accelerators-test-" + std::to_string(getpid()) + ".toml");
    std::ofstream(path) << text;
  }
  ~TempToml() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

std::string load_error(const std::string& text) {
  TempToml file(text);
  try {
    load_accelerator_types(file.path.string());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the fake NVML's GPUs are listed with their index, name, UUID and memory") {
  FakeNode node(kTwoH100);
  AcceleratorInventory inv = detect_accelerators();
  CHECK(inv.nvml_loaded);
  CHECK(inv.nvml_error.empty());
  CHECK(inv.driver_version == "0.0.0-airhost-fake-nvml");
  CHECK(inv.node_gpu_count == 2);
  REQUIRE(inv.gpus.size() == 2);
  CHECK(inv.gpus[0].index == 0);
  CHECK(inv.gpus[1].index == 1);
  CHECK(inv.gpus[0].name == "NVIDIA H100 80GB HBM3");
  CHECK(inv.gpus[0].uuid == "GPU-aaaa1111-0000-0000-0000-000000000000");
  CHECK(inv.gpus[1].uuid == "GPU-bbbb2222-0000-0000-0000-000000000000");
  CHECK(inv.gpus[0].memory_total == 81559ULL * 1024 * 1024);
}

TEST_CASE("a fake NVML with no GPUs gives a loaded NVML and an empty list") {
  FakeNode node("");
  AcceleratorInventory inv = detect_accelerators();
  CHECK(inv.nvml_loaded);
  CHECK(inv.nvml_error.empty());
  CHECK(inv.gpus.empty());
  CHECK(inv.node_gpu_count == 0);
}

TEST_CASE("detecting twice in one process sees the fake GPUs of the moment") {
  {
    FakeNode node(kTwoH100);
    CHECK(detect_accelerators().gpus.size() == 2);
  }
  FakeNode node(kFourMixed);
  CHECK(detect_accelerators().gpus.size() == 4);
}

TEST_CASE("CUDA_VISIBLE_DEVICES selects GPUs by NVML index, in its order") {
  CHECK(visible_under("2") == std::vector<int>{2});
  CHECK(visible_under("3,1") == std::vector<int>{3, 1});
  CHECK(visible_under(" 0 , 2 ") == std::vector<int>{0, 2});
  CHECK(visible_under("0,1,2,3") == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("CUDA_VISIBLE_DEVICES selects GPUs by full UUID or by a unique UUID prefix") {
  CHECK(visible_under("GPU-3333dddd") == std::vector<int>{3});
  CHECK(visible_under("GPU-2222cccc,GPU-1111aaaa") == std::vector<int>{2, 0});
  CHECK(visible_under("GPU-3,GPU-2") == std::vector<int>{3, 2});
  CHECK(visible_under("GPU-1112") == std::vector<int>{1});
}

TEST_CASE("the first invalid CUDA_VISIBLE_DEVICES entry ends the list, as in CUDA") {
  CHECK(visible_under("1,7,2") == std::vector<int>{1});    // index out of range
  CHECK(visible_under("2,-1,0") == std::vector<int>{2});   // negative index
  CHECK(visible_under("0,,1") == std::vector<int>{0});     // empty entry
  CHECK(visible_under("1,GPU-3333dddd") == std::vector<int>{1});  // a UUID in an index list
  CHECK(visible_under("GPU-2222cccc,GPU-1,GPU-3333dddd") == std::vector<int>{2});  // ambiguous
  CHECK(visible_under("GPU-3333dddd,GPU-ffff") == std::vector<int>{3});            // unknown
  CHECK(visible_under("GPU-3333dddd,0") == std::vector<int>{3});  // an index in a UUID list
}

TEST_CASE("CUDA_VISIBLE_DEVICES naming a GPU twice hides every GPU, as in CUDA") {
  CHECK(visible_under("1,1").empty());
  CHECK(visible_under("GPU-2222,GPU-2222cccc").empty());
}

TEST_CASE("an empty, -1 or 'none' CUDA_VISIBLE_DEVICES hides every GPU") {
  for (const char* hide_all : {"", "-1", "none", "NoDevFiles", " "}) {
    CAPTURE(hide_all);
    FakeNode node(kTwoH100, hide_all);
    AcceleratorInventory inv = detect_accelerators();
    CHECK(inv.nvml_loaded);
    CHECK(inv.nvml_error.empty());
    CHECK(inv.gpus.empty());
    CHECK(inv.node_gpu_count == 2);
  }
}

TEST_CASE("CUDA_VISIBLE_DEVICES naming MIG instances hides every GPU and says why") {
  FakeNode node(kTwoH100, "MIG-4b1e7d2c-0000-0000-0000-000000000000");
  AcceleratorInventory inv = detect_accelerators();
  CHECK(inv.gpus.empty());
  CHECK(inv.nvml_error.find("MIG") != std::string::npos);
}

TEST_CASE("the default rank count is the visible GPU count, or 1 without GPUs") {
  {
    FakeNode node(kFourMixed);
    CHECK(default_rank_count(detect_accelerators()) == 4);
  }
  {
    FakeNode node(kFourMixed, "1,3");
    CHECK(default_rank_count(detect_accelerators()) == 2);
  }
  {
    FakeNode node("");
    CHECK(default_rank_count(detect_accelerators()) == 1);
  }
  CHECK(default_rank_count(AcceleratorInventory{}) == 1);
}

TEST_CASE("assign_devices gives the first visible GPUs' NVML indices when they suffice") {
  FakeNode node(kFourMixed, "3,1,2");
  AcceleratorInventory inv = detect_accelerators();
  CHECK(assign_devices(inv, 1) == std::vector<int>{3});
  CHECK(assign_devices(inv, 2) == std::vector<int>{3, 1});
  CHECK(assign_devices(inv, 3) == std::vector<int>{3, 1, 2});
}

TEST_CASE("asking for more GPUs than are visible is an error naming both numbers and the GPUs") {
  FakeNode node(kTwoH100);
  std::string error = assign_error(detect_accelerators(), 8);
  CHECK(error.find("asked for 8 accelerators") != std::string::npos);
  CHECK(error.find("has 2 visible GPUs (2 x NVIDIA H100 80GB HBM3)") != std::string::npos);
  CHECK(error.find("ask for at most 2") != std::string::npos);
  // CUDA_VISIBLE_DEVICES hides nothing here, so unsetting it would not help.
  CHECK(error.find("CUDA_VISIBLE_DEVICES") == std::string::npos);
}

TEST_CASE("the too-many-GPUs error suggests unsetting CUDA_VISIBLE_DEVICES when it hides some") {
  FakeNode node(kFourMixed, "2");
  std::string error = assign_error(detect_accelerators(), 3);
  CHECK(error.find("asked for 3 accelerators but this node has 1 visible GPU (1 x NVIDIA H100 "
                   "80GB HBM3); ask for at most 1, or unset CUDA_VISIBLE_DEVICES") !=
        std::string::npos);
  CHECK(error.find("which hides 3 of the node's 4 GPUs") != std::string::npos);
}

TEST_CASE("a node without visible GPUs gets CPU ranks for any rank count") {
  FakeNode node("");
  AcceleratorInventory inv = detect_accelerators();
  CHECK(assign_devices(inv, 1).empty());
  CHECK(assign_devices(inv, 16).empty());
  CHECK(assign_devices(AcceleratorInventory{}, 4).empty());
}

TEST_CASE("asking for fewer than one accelerator is an error") {
  FakeNode node(kTwoH100);
  CHECK(assign_error(detect_accelerators(), 0).find("asked for 0 accelerators") !=
        std::string::npos);
  CHECK(!assign_error(AcceleratorInventory{}, -1).empty());
}

TEST_CASE("an NVML library that cannot be loaded means no GPUs and a sentence saying why") {
  ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  AcceleratorInventory inv = detect_accelerators();
  CHECK_FALSE(inv.nvml_loaded);
  CHECK(inv.gpus.empty());
  CHECK(inv.nvml_error.find("AIRHOST_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 could not be "
                            "loaded") != std::string::npos);
  CHECK(default_rank_count(inv) == 1);
  CHECK(assign_devices(inv, 2).empty());
}

TEST_CASE("a library without the NVML functions means no GPUs and a sentence saying why") {
  ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", "libc.so.6");
  AcceleratorInventory inv = detect_accelerators();
  CHECK_FALSE(inv.nvml_loaded);
  CHECK(inv.gpus.empty());
  CHECK(inv.nvml_error == "libc.so.6 lacks nvmlInit_v2: the NVIDIA driver is too old or the "
                          "library is not NVML");
}

TEST_CASE("the real libnvidia-ml.so.1 either loads or is reported missing, never throws") {
  ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", std::nullopt);
  AcceleratorInventory inv = detect_accelerators();
  if (inv.nvml_loaded) {
    CHECK(inv.nvml_error.empty());
    CHECK_FALSE(inv.driver_version.empty());
  } else {
    CHECK(inv.gpus.empty());
    CHECK(inv.nvml_error.find("libnvidia-ml.so.1") != std::string::npos);
  }
}

TEST_CASE("an NVML whose init fails means no GPUs and NVML's reason") {
  FakeNode node(kTwoH100);
  node.env.set("AIRHOST_FAKE_NVML_FAIL", "1");
  AcceleratorInventory inv = detect_accelerators();
  CHECK_FALSE(inv.nvml_loaded);
  CHECK(inv.gpus.empty());
  CHECK(inv.nvml_error.find("NVML did not start: Driver Not Loaded (NVML error 9)") !=
        std::string::npos);
}

TEST_CASE("the environment is as it was after a test changed it") {
  ScopedEnv outer;
  outer.set("AIRHOST_FAKE_NVML_GPUS", "before").set("CUDA_VISIBLE_DEVICES", std::nullopt);
  {
    FakeNode node(kTwoH100, "0");
    CHECK(std::string(std::getenv("CUDA_VISIBLE_DEVICES")) == "0");
  }
  CHECK(std::string(std::getenv("AIRHOST_FAKE_NVML_GPUS")) == "before");
  CHECK(std::getenv("CUDA_VISIBLE_DEVICES") == nullptr);
}

TEST_CASE("configs/accelerators.toml loads with the Databricks type names") {
  std::vector<AcceleratorType> types = load_accelerator_types(table_path());
  std::map<std::string, AcceleratorType> by_name;
  for (const auto& t : types) by_name[t.name] = t;
  for (const char* name : {"GPU_1xA10", "GPU_4xA10", "GPU_1xA100", "GPU_8xA100", "GPU_1xH100",
                           "GPU_8xH100", "GPU_1xH200", "GPU_8xH200", "GPU_1xB200", "GPU_8xB200",
                           "GPU_8xB300", "GPU_1xL4", "GPU_4xL4", "GPU_1xL40S"}) {
    CAPTURE(name);
    CHECK(by_name.count(name) == 1);
  }
  CHECK(by_name["GPU_8xH100"].gpu == "H100");
  CHECK(by_name["GPU_8xH100"].count == 8);
  CHECK(by_name["GPU_1xA10"].gpu == "A10");
  CHECK(by_name["GPU_1xA10"].count == 1);
  CHECK(by_name["GPU_4xL4"].count == 4);
}

TEST_CASE("NVML names map to A10, A100, H100 and H200 by whole tokens, never substrings") {
  std::vector<AcceleratorType> types = load_accelerator_types(table_path());
  CHECK(gpu_model_of(types, "NVIDIA A10") == "A10");
  CHECK(gpu_model_of(types, "NVIDIA A10G") == "A10");
  CHECK(gpu_model_of(types, "NVIDIA A10-24Q") == "A10");
  CHECK(gpu_model_of(types, "NVIDIA A100-SXM4-80GB") == "A100");
  CHECK(gpu_model_of(types, "NVIDIA A100 80GB PCIe") == "A100");
  CHECK(gpu_model_of(types, "NVIDIA H100 80GB HBM3") == "H100");
  CHECK(gpu_model_of(types, "NVIDIA H100 PCIe") == "H100");
  CHECK(gpu_model_of(types, "NVIDIA H200") == "H200");
  CHECK(gpu_model_of(types, "NVIDIA H200 NVL") == "H200");
  CHECK(gpu_model_of(types, "nvidia h100 nvl") == "H100");
  CHECK(gpu_model_of(types, "NVIDIA L4") == "L4");
  CHECK(gpu_model_of(types, "NVIDIA L40S") == "L40S");
  CHECK(gpu_model_of(types, "NVIDIA B200") == "B200");
  CHECK(gpu_model_of(types, "NVIDIA B300 SXM6 AC") == "B300");
  CHECK(gpu_model_of(types, "NVIDIA GH200 480GB") == std::nullopt);
  CHECK(gpu_model_of(types, "NVIDIA L40") == std::nullopt);
  CHECK(gpu_model_of(types, "Tesla T4") == std::nullopt);
  CHECK(gpu_model_of(types, "") == std::nullopt);
}

TEST_CASE("a match entry of several tokens matches them in sequence") {
  std::vector<AcceleratorType> types = {{"GPU_1xRTX6000", "RTX6000", 1, {"RTX 6000"}}};
  CHECK(gpu_model_of(types, "NVIDIA RTX 6000 Ada Generation") == "RTX6000");
  CHECK(gpu_model_of(types, "NVIDIA RTX A6000") == std::nullopt);
  CHECK(gpu_model_of(types, "Quadro RTX 8000") == std::nullopt);
}

TEST_CASE("a broken accelerator table is a ConfigError with file, line and column") {
  TempToml probe("");
  const std::string file = probe.path.string();

  std::string error = load_error("[[type]]\nname = \"GPU_1xA10\"\ngpu = \"A10\ncount = 1\n");
  CHECK(error.rfind(file + ":3:", 0) == 0);

  error = load_error("[[type]]\nname = \"GPU_1xA10\"\ngpu = \"A10\"\ncount = \"one\"\n"
                     "match = [\"A10\"]\n");
  CHECK(error.rfind(file + ":4:", 0) == 0);
  CHECK(error.find("'count' must be an integer") != std::string::npos);

  error = load_error("[[type]]\nname = \"GPU_1xA10\"\ngpu = \"A10\"\ncount = 1\n"
                     "match = [\"A10\"]\nmathc = [\"A10\"]\n");
  CHECK(error.rfind(file + ":6:1: unknown key 'mathc'", 0) == 0);

  error = load_error("[[type]]\nname = \"GPU_8xA10\"\ngpu = \"A10\"\ncount = 1\n"
                     "match = [\"A10\"]\n");
  CHECK(error.find("its name must be 'GPU_1xA10'") != std::string::npos);

  error = load_error("[[type]]\nname = \"GPU_1xA10\"\ngpu = \"A10\"\ncount = 1\n"
                     "match = [\"A10\"]\n\n[[type]]\nname = \"GPU_4xA10\"\ngpu = \"A10\"\n"
                     "count = 4\nmatch = [\"A10G\"]\n");
  CHECK(error.rfind(file + ":7:", 0) == 0);
  CHECK(error.find("same model must match the same names") != std::string::npos);

  error = load_error("[[type]]\nname = \"GPU_1xA10\"\ngpu = \"A10\"\ncount = 1\nmatch = []\n");
  CHECK(error.find("'match' must be a non-empty array") != std::string::npos);

  error = load_error("title = \"x\"\n");
  CHECK(error.rfind(file + ":1:1: unknown key 'title'", 0) == 0);

  error = load_error("");
  CHECK(error.find("no [[type]] tables") != std::string::npos);
}

TEST_CASE("a missing accelerator table is a ConfigError naming the path") {
  try {
    load_accelerator_types("/nonexistent/accelerators.toml");
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("/nonexistent/accelerators.toml") != std::string::npos);
  }
}
