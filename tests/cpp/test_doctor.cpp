// `airhost doctor` against FAKES of the GPU stack, which build machines don't have: a fake
// NVML (tests/fake_nvml: libfake-nvidia-ml.so, topology included), a fake CUDA runtime,
// NCCL and cuBLAS (tests/fake_cuda: libfake-cudart.so, libfake-nccl.so, libfake-cublas.so,
// all working on host memory). None of them is NVIDIA's; each says so at its top. The fake
// CUDA events report a fixed elapsed time, so the bandwidths airhost prints are exact.
#include <doctest/doctest.h>

#include "support.hpp"

#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/accelerator_types.hpp"
#include "gpu/doctor.hpp"

#if !defined(AIRHOST_FAKE_NVML_PATH) || !defined(AIRHOST_FAKE_CUDART_PATH) || \
    !defined(AIRHOST_FAKE_NCCL_PATH) || !defined(AIRHOST_FAKE_CUBLAS_PATH)
#error "the fake GPU libraries' paths come from tests/fake_nvml and tests/fake_cuda (CMakeLists.txt)"
#endif

using namespace airhost::detail;

using airhost_test::ScopedEnv;

namespace {

const char* const kMissing = "/nonexistent/airhost-test/libmissing.so";

std::string h100s(int n) {
  std::string spec;
  for (int i = 0; i < n; ++i) {
    spec += (i ? ";" : "") + std::string("NVIDIA H100 80GB HBM3:81559:GPU-") + std::to_string(1000 + i);
  }
  return spec;
}

// An n x n topology with every pair `cell`.
std::string uniform_topology(int n, const std::string& cell) {
  std::string spec;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) spec += (j ? "," : "") + (i == j ? std::string("X") : cell);
    if (i + 1 < n) spec += ";";
  }
  return spec;
}

const char* const kFourTopology = "X,NV2,NV1,SYS;NV2,X,PIX,SYS;NV1,PIX,X,NODE;SYS,SYS,NODE,X";


// A node whose whole GPU stack is fake: n fake H100s seen by the fake NVML and the fake
// CUDA runtime, the fake NCCL and cuBLAS, CUDA events that always measure 1 ms.
struct FakeGpuNode {
  ScopedEnv env;
  explicit FakeGpuNode(int n, std::optional<std::string> topology = std::nullopt) {
    env.set("AIRHOST_NVML_LIBRARY", AIRHOST_FAKE_NVML_PATH)
        .set("AIRHOST_FAKE_NVML_GPUS", h100s(n))
        .set("AIRHOST_FAKE_NVML_FAIL", std::nullopt)
        .set("AIRHOST_FAKE_NVML_TOPOLOGY", topology)
        .set("AIRHOST_FAKE_NVML_NVSWITCH", std::nullopt)
        .set("AIRHOST_FAKE_NVML_CUDA_VERSION", std::nullopt)
        .set("AIRHOST_CUDART_LIBRARY", AIRHOST_FAKE_CUDART_PATH)
        .set("AIRHOST_NCCL_LIBRARY", AIRHOST_FAKE_NCCL_PATH)
        .set("AIRHOST_CUBLAS_LIBRARY", AIRHOST_FAKE_CUBLAS_PATH)
        .set("AIRHOST_FAKE_CUDA_DEVICES", std::to_string(n))
        .set("AIRHOST_FAKE_CUDA_EVENT_MS", "1")
        .set("AIRHOST_FAKE_CUDA_MALLOC_LIMIT_MIB", std::nullopt)
        .set("AIRHOST_FAKE_CUDA_RUNTIME_VERSION", std::nullopt)
        .set("AIRHOST_FAKE_NCCL_FAIL_INIT", std::nullopt)
        .set("AIRHOST_FAKE_NCCL_WRONG", std::nullopt)
        .set("AIRHOST_ACCELERATORS_TOML", std::string(AIRHOST_SOURCE_DIR) + "/configs/accelerators.toml")
        .set("CUDA_VISIBLE_DEVICES", std::nullopt);
  }
};

// Small enough for host memory: 16 MiB per fake GPU, a 64^3 SGEMM, 2 + 10 iterations (so
// each all-reduce takes 1 ms / 10 = 100 us by the fake events).
DoctorOptions small_options(std::vector<std::size_t> sizes = {8, 1 << 20}) {
  DoctorOptions o;
  o.sizes = std::move(sizes);
  o.warmup_iters = 2;
  o.iters = 10;
  o.memory_bytes = 16 << 20;
  o.gemm_n = 64;
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool any_contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (contains(l, part)) return true;
  return false;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The all-reduce table row for `bytes`, split into words; empty if there is none.
std::vector<std::string> table_row(const std::string& text, std::size_t bytes) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto w = words(line);
    if (!w.empty() && w[0] == std::to_string(bytes)) return w;
  }
  return {};
}

// A small strict JSON reader: checks the syntax and collects each object's keys by path
// ("gpus[].memory_check.copy_gbps"), which is all the tests need of the document.
class Json {
 public:
  explicit Json(const std::string& text) : s_(text) {
    ws();
    ok_ = value("") && (ws(), pos_ == s_.size());
  }
  bool ok() const { return ok_; }
  bool has(const std::string& path) const { return keys_.count(path) > 0; }
  // The raw text of the first value at `path` ("exit_code" → "3", "summary" → "\"...\"").
  std::string raw(const std::string& path) const {
    auto it = raw_.find(path);
    return it == raw_.end() ? "" : it->second;
  }

 private:
  void ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool lit(const char* word) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  bool string(std::string* out) {
    if (pos_ >= s_.size() || s_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c < 0x20) return false;
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size() || !std::strchr("\"\\/bfnrtu", s_[pos_])) return false;
        if (s_[pos_] == 'u') pos_ += 4;
      } else if (out) {
        *out += static_cast<char>(c);
      }
      ++pos_;
    }
    if (pos_ >= s_.size()) return false;
    ++pos_;
    return true;
  }
  bool number() {
    size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || std::strchr(".eE+-", s_[pos_]))) ++pos_;
    return pos_ > start && std::isdigit(static_cast<unsigned char>(s_[pos_ - 1]));
  }
  bool value(const std::string& path) {
    ws();
    if (pos_ >= s_.size()) return false;
    const size_t start = pos_;
    bool good = false;
    char c = s_[pos_];
    if (c == '{') {
      ++pos_;
      ws();
      good = true;
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
      } else {
        while (true) {
          ws();
          std::string key;
          if (!string(&key)) return false;
          const std::string child = path.empty() ? key : path + "." + key;
          keys_.insert(child);
          ws();
          if (pos_ >= s_.size() || s_[pos_++] != ':') return false;
          if (!value(child)) return false;
          ws();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == '}') {
            ++pos_;
            break;
          }
          return false;
        }
      }
    } else if (c == '[') {
      ++pos_;
      ws();
      good = true;
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
      } else {
        while (true) {
          if (!value(path + "[]")) return false;
          ws();
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            continue;
          }
          if (pos_ < s_.size() && s_[pos_] == ']') {
            ++pos_;
            break;
          }
          return false;
        }
      }
    } else if (c == '"') {
      good = string(nullptr);
    } else if (c == 't' || c == 'f' || c == 'n') {
      good = lit("true") || lit("false") || lit("null");
    } else {
      good = number();
    }
    if (good && !raw_.count(path)) raw_[path] = s_.substr(start, pos_ - start);
    return good;
  }

  const std::string& s_;
  size_t pos_ = 0;
  bool ok_ = false;
  std::set<std::string> keys_;
  std::map<std::string, std::string> raw_;
};

void check_json_shape(const std::string& text) {
  CHECK(!text.empty());
  CHECK(text.back() == '\n');
  CHECK(text.find('\n') == text.size() - 1);  // one line
  Json json(text);
  REQUIRE(json.ok());
  for (const char* key : {"exit_code", "ok", "summary", "problems", "notes", "nvml_loaded", "nvml_error",
                          "driver_version", "cuda_driver_version", "node_gpu_count", "cuda_visible_devices",
                          "accelerator_type", "gpus", "topology", "topology.matrix", "cuda_runtime",
                          "cuda_runtime.loaded", "cuda_runtime.error", "nccl", "nccl.version", "cublas",
                          "allreduce", "allreduce.rows", "allreduce.avg_busbw_gbps"}) {
    CAPTURE(key);
    CHECK(json.has(key));
  }
}

// Runs `command` with sh, returns its stdout; `status` gets the exit code.
std::string run_command(const std::string& command, int* status) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

}  // namespace

// --- No GPU: exit code 3 ----------------------------------------------------------------------

TEST_CASE("a fake NVML with no GPU makes the doctor say so, exit 3 and promise CPU ranks") {
  FakeGpuNode node(0);
  node.env.set("AIRHOST_FAKE_NVML_GPUS", "");
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 3);
  CHECK(r.nvml_loaded);
  CHECK(r.gpus.empty());
  CHECK(contains(r.summary, "No usable NVIDIA GPU on this node"));
  CHECK(contains(r.summary, "NVML lists no GPU"));
  CHECK(contains(r.summary, "CPU ranks"));
  const std::string text = doctor_text(r);
  CHECK(contains(text, "No usable NVIDIA GPU on this node."));
  CHECK(contains(text, "Why: the NVIDIA driver is loaded but NVML lists no GPU"));
  CHECK(contains(text, "airhost will run CPU ranks here"));
  CHECK(contains(text, "exit code 3 (no accelerator)"));
  // No GPU to check, but the doctor says which CUDA libraries the node has (the fakes here)
  // and why the CUDA runtime sees no device, touching none.
  CHECK(r.cudart.loaded);
  CHECK(r.cudart.path == AIRHOST_FAKE_CUDART_PATH);
  CHECK(contains(r.cuda_device_error, "cudaGetDeviceCount: "));
  CHECK(contains(r.cuda_device_error, "(CUDA error 100)"));
  CHECK(r.nccl.loaded);
  CHECK_FALSE(r.nccl.version.empty());
  CHECK(r.cublas.loaded);
  CHECK(r.problems.empty());
  CHECK(contains(text, "CUDA runtime: " + r.cudart.version + " (" + AIRHOST_FAKE_CUDART_PATH + "); cudaGetDeviceCount: "));
  CHECK(contains(text, "NCCL:         " + r.nccl.version + " ("));
  // NVML is there (the driver is): no hint about a container started without its GPUs.
  CHECK_FALSE(contains(text, "docker run --gpus all"));
  const std::string json = doctor_json(r);
  check_json_shape(json);
  Json parsed(json);
  CHECK(parsed.raw("exit_code") == "3");
  CHECK(parsed.raw("ok") == "false");
  CHECK(parsed.raw("nvml_loaded") == "true");
  CHECK(parsed.raw("accelerator_type") == "null");
}

TEST_CASE("a missing NVML library makes the doctor name it, exit 3 and promise CPU ranks") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 3);
  CHECK_FALSE(r.nvml_loaded);
  CHECK(contains(r.summary, "AIRHOST_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 could not be loaded"));
  CHECK(contains(r.summary, "CPU ranks"));
  CHECK(contains(doctor_text(r), "Why: AIRHOST_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1"));
  const std::string json = doctor_json(r);
  check_json_shape(json);
  CHECK(Json(json).raw("nvml_loaded") == "false");
}

TEST_CASE("without NVML, CUDA libraries that are present point at a container started without its GPUs") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_NVML_LIBRARY", kMissing).set("AIRHOST_CUBLAS_LIBRARY", kMissing);
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 3);
  CHECK(r.cudart.loaded);
  CHECK(r.cuda_device_count == 2);  // the fake runtime sees its GPUs; NVML decides usability
  CHECK(r.cuda_device_error.empty());
  CHECK(r.nccl.loaded);
  CHECK_FALSE(r.cublas.loaded);
  CHECK(r.problems.empty());  // a missing library is no failure on a node without GPUs
  const std::string text = doctor_text(r);
  CHECK(contains(text, "cuBLAS:       " + r.cublas.error));
  CHECK(contains(text, "The CUDA libraries are here but no NVIDIA driver is."));
  CHECK(contains(text, "docker run --gpus all"));
  Json json(doctor_json(r));
  CHECK(json.raw("cuda_device_count") == "2");
  CHECK(json.raw("cuda_device_error") == "\"\"");
}

TEST_CASE("the quick doctor (--preflight) of a node without GPUs loads no CUDA library") {
  FakeGpuNode node(0);
  node.env.set("AIRHOST_FAKE_NVML_GPUS", "");
  DoctorOptions quick = small_options();
  quick.quick = true;
  const DoctorReport r = run_doctor(quick);
  CHECK(r.exit_code == 3);
  CHECK_FALSE(r.cudart.loaded);
  CHECK(r.cudart.error.empty());
  CHECK_FALSE(r.nccl.loaded);
  CHECK_FALSE(contains(doctor_text(r), "CUDA runtime:"));
}

TEST_CASE("a CUDA_VISIBLE_DEVICES that hides every GPU is named as the reason for exit 3") {
  FakeGpuNode node(2);
  node.env.set("CUDA_VISIBLE_DEVICES", "");
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 3);
  CHECK(contains(r.summary, "CUDA_VISIBLE_DEVICES='' hides all 2 of the node's GPUs"));
  check_json_shape(doctor_json(r));
}

TEST_CASE("an NVML whose driver is not loaded gives exit 3 with NVML's reason") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_NVML_FAIL", "1");
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 3);
  CHECK(contains(r.summary, "Driver Not Loaded"));
}

TEST_CASE("the airhost binary's doctor prints the no-GPU message and exits 3 without NVML") {
  const std::string binary = std::string(AIRHOST_BINARY_DIR) + "/airhost";
  const std::string env = "env -u CUDA_VISIBLE_DEVICES AIRHOST_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 ";
  int status = -1;
  std::string out = run_command(env + "'" + binary + "' doctor", &status);
  CHECK(status == 3);
  CHECK(contains(out, "No usable NVIDIA GPU on this node."));
  CHECK(contains(out, "/nonexistent/libnvidia-ml.so.1 could not be loaded"));
  CHECK(contains(out, "airhost will run CPU ranks here"));

  out = run_command(env + "'" + binary + "' doctor --json", &status);
  CHECK(status == 3);
  check_json_shape(out);
  Json json(out);
  CHECK(json.raw("exit_code") == "3");
  CHECK(json.raw("gpus") == "[]");
}

// --- GPUs (fakes): the report -------------------------------------------------------------

TEST_CASE("the doctor lists the fake GPUs with driver, CUDA and library versions") {
  FakeGpuNode node(4, kFourTopology);
  const DoctorReport r = run_doctor(small_options());
  CHECK(r.exit_code == 0);
  CHECK(r.problems.empty());
  REQUIRE(r.gpus.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(r.gpus[i].index == i);
    CHECK(r.gpus[i].cuda_device == i);
    CHECK(r.gpus[i].name == "NVIDIA H100 80GB HBM3");
    CHECK(r.gpus[i].model == "H100");
    CHECK(r.gpus[i].memory_total == 81559ULL << 20);
  }
  CHECK(r.gpus[2].pci_bus_id == "00000000:03:00.0");
  CHECK(r.driver_version == "0.0.0-airhost-fake-nvml");
  CHECK(r.cuda_driver_version == "12.4");
  CHECK(r.cudart.loaded);
  CHECK(r.cudart.version == "12.4");
  CHECK(r.cudart.path == AIRHOST_FAKE_CUDART_PATH);
  CHECK(r.nccl.version == "2.21.5");
  CHECK(r.cublas.version == "12.4.2");
  CHECK(r.cuda_device_count == 4);

  const std::string text = doctor_text(r);
  CHECK(contains(text, "NVIDIA driver 0.0.0-airhost-fake-nvml (CUDA 12.4), 4 GPU(s) visible of 4 on the node"));
  CHECK(contains(text, "CUDA runtime: 12.4 (" AIRHOST_FAKE_CUDART_PATH ")"));
  CHECK(contains(text, "NCCL:         2.21.5 (" AIRHOST_FAKE_NCCL_PATH ")"));
  CHECK(contains(text, "airhost doctor: All checks passed on 4 GPU(s)"));
  // 4 x H100 is no Databricks type: a note, not a failure.
  CHECK(r.accelerator_type.empty());
  CHECK(any_contains(r.notes, "has no type of 4 x H100 (it has GPU_1xH100, GPU_8xH100)"));
}

TEST_CASE("8 fake H100s map to GPU_8xH100 and show NV18 through an NVSwitch, as nvidia-smi does") {
  FakeGpuNode node(8, uniform_topology(8, "NV18"));
  node.env.set("AIRHOST_FAKE_NVML_NVSWITCH", "1");
  const DoctorReport r = run_doctor(small_options({1 << 20}));
  CHECK(r.exit_code == 0);
  CHECK(r.accelerator_type == "GPU_8xH100");
  REQUIRE(r.topology.size() == 8);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) CHECK(r.topology[i][j] == (i == j ? "X" : "NV18"));
  const std::string text = doctor_text(r);
  CHECK(contains(text, "Accelerator type: GPU_8xH100"));
  CHECK(contains(text, "GPU7    NV18    NV18    NV18    NV18    NV18    NV18    NV18    X\n"));
  CHECK(contains(r.summary, "(GPU_8xH100)"));
}

TEST_CASE("the topology matrix reads like nvidia-smi topo -m: NV# for NVLinks, else the PCIe path") {
  FakeGpuNode node(4, kFourTopology);
  const DoctorReport r = run_doctor(small_options({8}));
  REQUIRE(r.exit_code == 0);
  const std::string text = doctor_text(r);
  CHECK(contains(text,
                 "Topology (as nvidia-smi topo -m):\n"
                 "        GPU0    GPU1    GPU2    GPU3\n"
                 "GPU0    X       NV2     NV1     SYS\n"
                 "GPU1    NV2     X       PIX     SYS\n"
                 "GPU2    NV1     PIX     X       NODE\n"
                 "GPU3    SYS     SYS     NODE    X\n"
                 "Legend:\n"));
  CHECK(contains(text, "  NV#  = Connection traversing a bonded set of # NVLinks"));
  // Without a topology every pair of the fake is under one host bridge.
  FakeGpuNode plain(2);
  const DoctorReport p = run_doctor(small_options({8}));
  REQUIRE(p.topology.size() == 2);
  CHECK(p.topology[0][1] == "PHB");
}

TEST_CASE("CUDA_VISIBLE_DEVICES narrows the doctor to those GPUs, matched to CUDA by PCI bus ID") {
  FakeGpuNode node(4, kFourTopology);
  node.env.set("CUDA_VISIBLE_DEVICES", "3,1");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 0);
  REQUIRE(r.gpus.size() == 2);
  CHECK(r.gpus[0].index == 3);
  CHECK(r.gpus[0].cuda_device == 0);
  CHECK(r.gpus[1].index == 1);
  CHECK(r.gpus[1].cuda_device == 1);
  REQUIRE(r.topology.size() == 2);
  CHECK(r.topology[0][1] == "SYS");
  CHECK(r.allreduce_ranks == 2);
  CHECK(contains(doctor_text(r), "2 GPU(s) visible of 4 on the node (CUDA_VISIBLE_DEVICES=3,1)"));
}

// --- GPUs (fakes): memory, compute and the all-reduce ----------------------------------------

TEST_CASE("the all-reduce table prints size, count, time, algbw and busbw = algbw x 2(n-1)/n") {
  FakeGpuNode node(4, kFourTopology);
  const DoctorReport r = run_doctor(small_options({8, 1 << 20}));
  REQUIRE(r.exit_code == 0);
  CHECK(r.allreduce_ran);
  CHECK(r.allreduce_ranks == 4);
  REQUIRE(r.allreduce.size() == 2);
  // The fake events measure 1 ms for 10 timed all-reduces: 100 us each.
  const AllReduceRow& big = r.allreduce[1];
  CHECK(big.bytes == 1048576);
  CHECK(big.count == 262144);
  CHECK(big.time_us == doctest::Approx(100.0));
  CHECK(big.algbw_gbps == doctest::Approx(1048576 / 100e-6 / 1e9));
  CHECK(big.busbw_gbps == doctest::Approx(big.algbw_gbps * 2 * 3 / 4));
  CHECK(big.wrong == 0);
  CHECK(r.allreduce[0].count == 2);
  CHECK(r.avg_busbw_gbps == doctest::Approx((r.allreduce[0].busbw_gbps + big.busbw_gbps) / 2));

  const std::string text = doctor_text(r);
  CHECK(contains(text, "NCCL all-reduce across 4 GPU(s) in this process"));
  CHECK(contains(text, "2 warm-up + 10 timed iterations"));
  CHECK(contains(text, "#        size          count      type   redop       time    algbw    busbw  #wrong\n"));
  CHECK(table_row(text, 1048576) ==
        std::vector<std::string>{"1048576", "262144", "float", "sum", "100.00", "10.49", "15.73", "0"});
  CHECK(table_row(text, 8) == std::vector<std::string>{"8", "2", "float", "sum", "100.00", "0.00", "0.00", "0"});
  CHECK(contains(text, "# Avg bus bandwidth    : 7.86 GB/s"));
}

TEST_CASE("busbw follows nccl-tests: algbw x 2(n-1)/n, so 0 on one GPU") {
  CHECK(allreduce_busbw(10.0, 8) == doctest::Approx(17.5));
  CHECK(allreduce_busbw(10.0, 4) == doctest::Approx(15.0));
  CHECK(allreduce_busbw(10.0, 2) == doctest::Approx(10.0));
  CHECK(allreduce_busbw(10.0, 1) == 0.0);
  CHECK(allreduce_busbw(10.0, 0) == 0.0);
}

TEST_CASE("with one GPU the all-reduce still runs, busbw is 0 and algbw is printed") {
  FakeGpuNode node(1);
  const DoctorReport r = run_doctor(small_options({1 << 20}));
  CHECK(r.exit_code == 0);
  CHECK(r.allreduce_ranks == 1);
  REQUIRE(r.allreduce.size() == 1);
  CHECK(r.allreduce[0].busbw_gbps == 0.0);
  CHECK(r.allreduce[0].algbw_gbps == doctest::Approx(10.48576));
  CHECK(r.allreduce[0].wrong == 0);
  CHECK(contains(r.summary, "NCCL all-reduce algbw 10.49 GB/s at 1 MiB (one GPU: busbw is 0)"));
  CHECK(r.accelerator_type == "GPU_1xH100");
  CHECK(table_row(doctor_text(r), 1048576) ==
        std::vector<std::string>{"1048576", "262144", "float", "sum", "100.00", "10.49", "0.00", "0"});
}

TEST_CASE("the memory check copies device to device and times it; cuBLAS SGEMM gives TFLOP/s") {
  FakeGpuNode node(2);
  const DoctorReport r = run_doctor(small_options({8}));
  REQUIRE(r.exit_code == 0);
  CHECK(r.copy_iters == 5);
  CHECK(r.gemm_iters == 5);
  for (const auto& g : r.gpus) {
    CHECK(g.memory_checked);
    CHECK(g.memory_ok);
    // 5 copies of 8 MiB, read and written, in the fake's 1 ms.
    CHECK(g.copy_gbps == doctest::Approx(2.0 * (8 << 20) * 5 / 1e-3 / 1e9));
    CHECK(g.gemm_ran);
    CHECK(g.gemm_tflops == doctest::Approx(2.0 * 64 * 64 * 64 * 5 / 1e-3 / 1e12));
  }
  const std::string text = doctor_text(r);
  CHECK(contains(text, "Memory and compute per GPU (cudaMalloc 16 MiB, device-to-device copy x5, FP32 SGEMM 64^3 x5):"));
  CHECK(contains(text, "  0    ok" + std::string(17, ' ') + "83.9" + std::string(13, ' ') + "0.00\n"));
}

TEST_CASE("the doctor's JSON has the GPUs, topology, libraries and all-reduce rows") {
  FakeGpuNode node(2, "X,NV4;NV4,X");
  const DoctorReport r = run_doctor(small_options({8, 1 << 20}));
  REQUIRE(r.exit_code == 0);
  const std::string json = doctor_json(r);
  check_json_shape(json);
  Json parsed(json);
  for (const char* key : {"gpus[].index", "gpus[].cuda_device", "gpus[].name", "gpus[].uuid", "gpus[].pci_bus_id",
                          "gpus[].memory_total", "gpus[].model", "gpus[].memory_check.copy_gbps",
                          "gpus[].compute_check.sgemm_tflops", "allreduce.rows[].size", "allreduce.rows[].count",
                          "allreduce.rows[].time_us", "allreduce.rows[].algbw_gbps", "allreduce.rows[].busbw_gbps",
                          "allreduce.rows[].wrong", "allreduce.ranks", "nccl.path", "cublas.loaded"}) {
    CAPTURE(key);
    CHECK(parsed.has(key));
  }
  CHECK(parsed.raw("exit_code") == "0");
  CHECK(parsed.raw("ok") == "true");
  CHECK(parsed.raw("topology.matrix") == R"([["X", "NV4"], ["NV4", "X"]])");
  CHECK(parsed.raw("cuda_runtime.version") == "\"12.4\"");
  CHECK(parsed.raw("allreduce.rows") ==
        R"([{"size": 8, "count": 2, "time_us": 100.000, "algbw_gbps": 0.000, "busbw_gbps": 0.000, "wrong": 0}, )"
        R"({"size": 1048576, "count": 262144, "time_us": 100.000, "algbw_gbps": 10.486, "busbw_gbps": 10.486, "wrong": 0}])");
}

// --- GPUs (fakes): failures, exit code 4 ---------------------------------------------------

TEST_CASE("a missing NCCL fails the doctor with exit 4, naming NCCL and how to get it") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_NCCL_LIBRARY", kMissing);
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.problems.size() == 1);
  CHECK(contains(r.problems[0], "NCCL (libnccl) could not be loaded: AIRHOST_NCCL_LIBRARY=" + std::string(kMissing)));
  CHECK_FALSE(r.allreduce_ran);
  CHECK(r.library_missing);  // --preflight only warns: torch may bring its own NCCL
  // The checks before NCCL still ran.
  CHECK(r.gpus[0].memory_ok);
  const std::string text = doctor_text(r);
  CHECK(contains(text, "NCCL:         MISSING: NCCL (libnccl) could not be loaded"));
  CHECK(contains(text, "FAILED: NCCL (libnccl) could not be loaded"));
  CHECK(contains(text, "airhost doctor: 1 check failed on 2 GPU(s): NCCL (libnccl)"));
  check_json_shape(doctor_json(r));
  CHECK(Json(doctor_json(r)).raw("exit_code") == "4");
}

TEST_CASE("a missing CUDA runtime fails the doctor with exit 4 and skips the rest") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_CUDART_LIBRARY", kMissing);
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.problems.size() == 1);
  CHECK(contains(r.problems[0], "the CUDA runtime (libcudart) could not be loaded: AIRHOST_CUDART_LIBRARY="));
  CHECK_FALSE(r.gpus[0].memory_checked);
  CHECK_FALSE(r.allreduce_ran);
  CHECK(r.gpus.size() == 2);  // NVML's part of the report is still there
}

TEST_CASE("a CUDA runtime that sees no device fails the doctor with exit 4 and CUDA's error") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_CUDA_DEVICES", "0");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.problems.size() == 1);
  CHECK(contains(r.problems[0], "sees no GPU although NVML lists 2: no CUDA-capable device is detected (CUDA error 100)"));
}

TEST_CASE("a CUDA runtime newer than the driver is named as the likely cause") {
  FakeGpuNode node(1);
  node.env.set("AIRHOST_FAKE_CUDA_DEVICES", "0").set("AIRHOST_FAKE_CUDA_RUNTIME_VERSION", "12080");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.problems.size() == 1);
  CHECK(contains(r.problems[0], "needs a driver for CUDA 12.8 or newer and the driver supports CUDA 12.4"));
}

TEST_CASE("an allocation that fails is exit 4, naming the GPU and the size") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_CUDA_MALLOC_LIMIT_MIB", "8");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  CHECK(r.problems.at(0) == "GPU 0: memory check: cudaMalloc of 16 MiB failed: out of memory (CUDA error 2)");
  CHECK(r.problems.at(1) == "GPU 1: memory check: cudaMalloc of 16 MiB failed: out of memory (CUDA error 2)");
  CHECK_FALSE(r.gpus[0].memory_ok);
  CHECK_FALSE(r.gpus[0].gemm_ran);  // no compute check on a GPU whose memory failed
  CHECK_FALSE(r.library_missing);
  CHECK(contains(doctor_text(r), "  0    FAILED                -          skipped\n"));
}

TEST_CASE("NCCL failing to start is exit 4 with NCCL's own words") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_NCCL_FAIL_INIT", "1");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.problems.size() == 1);
  CHECK(contains(r.problems[0], "NCCL could not start on 2 GPU(s): ncclCommInitAll: unhandled system error"));
  CHECK(contains(r.problems[0], "AIRHOST_FAKE_NCCL_FAIL_INIT=1 makes ncclCommInitAll fail"));
  CHECK(contains(r.problems[0], "NCCL_DEBUG=INFO"));
  CHECK(r.problems[0].find("NCCL_DEBUG") == r.problems[0].rfind("NCCL_DEBUG"));  // said once
}

TEST_CASE("an all-reduce whose sums are wrong is exit 4: the doctor checks the reduced values") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_NCCL_WRONG", "1");
  const DoctorReport r = run_doctor(small_options({8, 4096}));
  CHECK(r.exit_code == 4);
  REQUIRE(r.allreduce.size() == 2);
  CHECK(r.allreduce[0].wrong == 2);    // 2 floats, wrong on the last GPU
  CHECK(r.allreduce[1].wrong == 512);  // 1024 floats: 256 checked at each end
  CHECK(contains(r.problems.at(0), "the NCCL all-reduce of 8 bytes gave wrong sums: 2 of the checked elements"));
}

TEST_CASE("a missing cuBLAS skips the compute check with a note, and still passes") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_CUBLAS_LIBRARY", kMissing);
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 0);
  CHECK_FALSE(r.gpus[0].gemm_ran);
  CHECK(any_contains(r.notes, "compute check skipped: cuBLAS (libcublas) could not be loaded"));
  const std::string text = doctor_text(r);
  CHECK(contains(text, "cuBLAS:       MISSING: cuBLAS (libcublas) could not be loaded"));
  CHECK(contains(text, "skipped\n"));
}

// --- Options, the table, the child process ----------------------------------------------------

TEST_CASE("the default all-reduce sizes run from 8 B to 256 MiB by x4; quick ones are few") {
  const auto sizes = allreduce_sizes({});
  REQUIRE(sizes.size() == 14);
  CHECK(sizes.front() == 8);
  CHECK(sizes[1] == 32);
  CHECK(sizes[12] == 128u << 20);
  CHECK(sizes.back() == 256u << 20);
  DoctorOptions quick;
  quick.quick = true;
  CHECK(allreduce_sizes(quick) == std::vector<std::size_t>{8, 64 << 10, 8 << 20, 64 << 20});
  quick.sizes = {4096};
  CHECK(allreduce_sizes(quick) == std::vector<std::size_t>{4096});
}

TEST_CASE("a quick doctor uses fewer iterations and a 256 MiB allocation") {
  FakeGpuNode node(1);
  DoctorOptions quick;
  quick.quick = true;
  quick.gemm_n = 64;  // the fake cuBLAS computes on the CPU
  const DoctorReport r = run_doctor(quick);
  CHECK(r.exit_code == 0);
  CHECK(r.warmup_iters == 2);
  CHECK(r.iters == 5);
  CHECK(r.memory_bytes == 256u << 20);
  CHECK(r.allreduce.size() == 4);
}

TEST_CASE("the accelerator table is found without AIRHOST_ACCELERATORS_TOML") {
  ScopedEnv env;
  env.set("AIRHOST_ACCELERATORS_TOML", std::nullopt);
  const std::string path = find_accelerators_toml();
  CHECK(contains(path, "accelerators.toml"));
  env.set("AIRHOST_ACCELERATORS_TOML", "/x/table.toml");
  CHECK(find_accelerators_toml() == "/x/table.toml");
}

TEST_CASE("an unreadable accelerator table leaves the type unknown, as a note") {
  FakeGpuNode node(1);
  node.env.set("AIRHOST_ACCELERATORS_TOML", "/nonexistent/accelerators.toml");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 0);
  CHECK(r.accelerator_type.empty());
  CHECK(any_contains(r.notes, "/nonexistent/accelerators.toml"));
}

TEST_CASE("the doctor in a child process reports back, for the devices it is given") {
  FakeGpuNode node(4, kFourTopology);
  DoctorOptions o = small_options({8});
  DoctorOutcome ok = run_doctor_in_child(o, 60, {2});
  CHECK(ok.exit_code == 0);
  CHECK(ok.problems.empty());
  CHECK(contains(ok.summary, "All checks passed on 1 GPU(s)"));
  CHECK(contains(ok.text, "1 GPU(s) visible of 4 on the node (CUDA_VISIBLE_DEVICES=2)"));
  CHECK(std::getenv("CUDA_VISIBLE_DEVICES") == nullptr);  // set in the child only

  node.env.set("AIRHOST_NCCL_LIBRARY", kMissing);
  DoctorOutcome bad = run_doctor_in_child(o, 60);
  CHECK(bad.exit_code == 4);
  REQUIRE(bad.problems.size() == 1);
  CHECK(contains(bad.problems[0], "NCCL (libnccl) could not be loaded"));
  CHECK(bad.library_missing);

  node.env.set("AIRHOST_NCCL_LIBRARY", AIRHOST_FAKE_NCCL_PATH).set("AIRHOST_FAKE_NCCL_FAIL_INIT", "1");
  DoctorOutcome failing = run_doctor_in_child(o, 60);
  CHECK(failing.exit_code == 4);
  CHECK_FALSE(failing.library_missing);
  CHECK(contains(failing.summary, "ncclCommInitAll"));
}

TEST_CASE("a CUDA runtime that sees other GPUs than NVML is noted, and CUDA's GPUs are checked") {
  FakeGpuNode node(2);
  node.env.set("AIRHOST_FAKE_CUDA_DEVICES", "3");
  const DoctorReport r = run_doctor(small_options({8}));
  CHECK(r.exit_code == 0);
  REQUIRE(r.gpus.size() == 3);
  CHECK(r.gpus[2].index == -1);
  CHECK(r.gpus[2].cuda_device == 2);
  CHECK(contains(r.gpus[2].name, "not matched to an NVML GPU"));
  CHECK(r.gpus[2].memory_ok);
  CHECK(r.allreduce_ranks == 3);
  CHECK(any_contains(r.notes, "the CUDA runtime sees 3 GPU(s) and NVML 2"));
  check_json_shape(doctor_json(r));
  CHECK(contains(doctor_text(r), "GPU0    X       PHB\n"));
}
