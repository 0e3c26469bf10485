// The doctor's parts that need no GPU and no library, each alone: the verdict and the report
// (text and JSON) of a DoctorReport built by hand, and the all-reduce arithmetic.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "gpu/doctor.hpp"
#include "gpu/doctor_parts.hpp"

using namespace airhost::detail;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

LibraryStatus loaded(const std::string& path, const std::string& version) {
  LibraryStatus l;
  l.loaded = true;
  l.path = path;
  l.version = version;
  return l;
}

DoctorGpu gpu(int index, const std::string& bus) {
  DoctorGpu g;
  g.index = index;
  g.cuda_device = index;
  g.name = "NVIDIA H100 80GB HBM3";
  g.uuid = "GPU-" + std::to_string(index);
  g.pci_bus_id = bus;
  g.memory_total = 80ULL << 30;
  g.model = "H100";
  g.memory_checked = true;
  g.memory_ok = true;
  g.copy_gbps = 1500.25;
  g.gemm_ran = true;
  g.gemm_tflops = 51.5;
  return g;
}

// Two H100s over 4 NVLinks, every check run; GPU 1's SGEMM failed.
DoctorReport two_gpus_one_failed_gemm() {
  DoctorReport r;
  r.nvml_loaded = true;
  r.driver_version = "550.54.15";
  r.cuda_driver_version = "12.4";
  r.node_gpu_count = 2;
  r.gpus = {gpu(0, "00000000:3B:00.0"), gpu(1, "00000000:5E:00.0")};
  r.gpus[1].gemm_ran = false;
  r.gpus[1].gemm_tflops = 0;
  r.gpus[1].gemm_error = "cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED";
  r.problems.push_back("GPU 1: compute check: " + r.gpus[1].gemm_error);
  r.topology = {{"X", "NV4"}, {"NV4", "X"}};
  r.cudart = loaded("/usr/lib/libcudart.so.12", "12.4");
  r.nccl = loaded("/usr/lib/libnccl.so.2", "2.21.5");
  r.cublas = loaded("/usr/lib/libcublas.so.12", "12.4.2");
  r.cuda_device_count = 2;
  r.memory_bytes = 1 << 30;
  r.copy_iters = 5;
  r.gemm_n = 4096;
  r.gemm_iters = 5;
  r.allreduce_ran = true;
  r.allreduce_ranks = 2;
  r.warmup_iters = 5;
  r.iters = 20;
  AllReduceRow row;
  row.bytes = 1 << 20;
  row.count = row.bytes / 4;
  time_allreduce_row(row, 1.0, 10, 2);
  r.allreduce = {row};
  r.avg_busbw_gbps = row.busbw_gbps;
  return r;
}

}  // namespace

TEST_CASE("the verdict of a report with a failed check is exit 4, its summary naming the check") {
  DoctorReport r = two_gpus_one_failed_gemm();
  doctor::conclude(r, true);
  CHECK(r.exit_code == 4);
  CHECK_FALSE(r.library_missing);
  CHECK(r.summary == "1 check failed on 2 GPU(s): GPU 1: compute check: cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED");
}

TEST_CASE("the verdict: every check passed names the type and the all-reduce; no GPU is exit 3") {
  DoctorReport r = two_gpus_one_failed_gemm();
  r.problems.clear();
  r.accelerator_type = "GPU_2xH100";
  doctor::conclude(r, true);
  CHECK(r.exit_code == 0);
  CHECK(r.summary == "All checks passed on 2 GPU(s) (GPU_2xH100): NCCL all-reduce busbw 10.49 GB/s at 1 MiB.");

  DoctorReport none;
  none.nvml_error = "libnvidia-ml.so.1 not found: no NVIDIA driver on this node";
  doctor::conclude(none, false);
  CHECK(none.exit_code == 3);
  CHECK(none.summary == "No usable NVIDIA GPU on this node: libnvidia-ml.so.1 not found: no NVIDIA driver on this "
                        "node. airhost will run CPU ranks here (torch.distributed's gloo backend).");
}

TEST_CASE("the verdict marks a failure that is only a missing NCCL as library_missing") {
  DoctorReport r = two_gpus_one_failed_gemm();
  r.problems.clear();
  r.nccl = LibraryStatus{};
  r.nccl.error = "NCCL (libnccl) not found (tried libnccl.so.2)";
  r.problems.push_back(r.nccl.error);
  doctor::conclude(r, true);
  CHECK(r.exit_code == 4);
  CHECK(r.library_missing);
}

TEST_CASE("the text report of GPUs, their links and a failed check, nvidia-smi and nccl-tests style") {
  DoctorReport r = two_gpus_one_failed_gemm();
  doctor::conclude(r, true);
  const std::string text = doctor_text(r);
  CHECK(contains(text, "NVIDIA driver 550.54.15 (CUDA 12.4), 2 GPU(s) visible of 2 on the node\n"));
  CHECK(contains(text, "  GPU  CUDA  Name                      Memory  Model  Bus ID\n"
                       "  0    0     NVIDIA H100 80GB HBM3   80.0 GiB  H100   00000000:3B:00.0\n"
                       "  1    1     NVIDIA H100 80GB HBM3   80.0 GiB  H100   00000000:5E:00.0\n"));
  CHECK(contains(text, "Accelerator type: none in the table (see the notes)\n"));
  CHECK(contains(text, "        GPU0    GPU1\nGPU0    X       NV4\nGPU1    NV4     X\nLegend:\n"));
  CHECK(contains(text, "CUDA runtime: 12.4 (/usr/lib/libcudart.so.12)\n"
                       "NCCL:         2.21.5 (/usr/lib/libnccl.so.2)\n"
                       "cuBLAS:       12.4.2 (/usr/lib/libcublas.so.12)\n"));
  CHECK(contains(text, "Memory and compute per GPU (cudaMalloc 1 GiB, device-to-device copy x5, FP32 SGEMM 4096^3 x5):\n"));
  CHECK(contains(text, "  0    ok               1500.2            51.50\n"));
  CHECK(contains(text, "  1    ok               1500.2           FAILED\n"));
  CHECK(contains(text, "NCCL all-reduce across 2 GPU(s) in this process (ncclCommInitAll; float sum, out of place; "
                       "5 warm-up + 20 timed iterations):\n"));
  CHECK(contains(text, "      1048576         262144     float     sum     100.00    10.49    10.49       0\n"));
  CHECK(contains(text, "# Avg bus bandwidth    : 10.49 GB/s\n"));
  CHECK(contains(text, "\nFAILED: GPU 1: compute check: cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED\n"));
  CHECK(text.size() >= r.summary.size() + 17);
  CHECK(text.substr(text.size() - r.summary.size() - 17) == "airhost doctor: " + r.summary + "\n");
}

TEST_CASE("the JSON report of GPUs, their links and a failed check: one line, every figure") {
  DoctorReport r = two_gpus_one_failed_gemm();
  doctor::conclude(r, true);
  const std::string json = doctor_json(r);
  CHECK(json.find('\n') == json.size() - 1);
  CHECK(contains(json, "{\"exit_code\": 4, \"ok\": false, \"summary\": \"1 check failed on 2 GPU(s): GPU 1: "));
  CHECK(contains(json, "\"problems\": [\"GPU 1: compute check: cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED\"]"));
  CHECK(contains(json, "\"cuda_visible_devices\": null, \"accelerator_type\": null"));
  CHECK(contains(json, "{\"index\": 1, \"cuda_device\": 1, \"name\": \"NVIDIA H100 80GB HBM3\", \"uuid\": \"GPU-1\", "
                       "\"pci_bus_id\": \"00000000:5E:00.0\", \"memory_total\": 85899345920, \"model\": \"H100\", "
                       "\"memory_check\": {\"ran\": true, \"ok\": true, \"bytes\": 1073741824, \"copy_gbps\": 1500.250, "
                       "\"error\": \"\"}, \"compute_check\": {\"ran\": false, \"n\": 4096, \"sgemm_tflops\": 0.000, "
                       "\"error\": \"cublasSgemm failed: CUBLAS_STATUS_EXECUTION_FAILED\"}}"));
  CHECK(contains(json, "\"topology\": {\"gpus\": [0, 1], \"matrix\": [[\"X\", \"NV4\"], [\"NV4\", \"X\"]]}"));
  CHECK(contains(json, "\"nccl\": {\"loaded\": true, \"path\": \"/usr/lib/libnccl.so.2\", \"version\": \"2.21.5\", \"error\": \"\"}"));
  CHECK(contains(json, "\"allreduce\": {\"ran\": true, \"ranks\": 2, \"type\": \"float\", \"op\": \"sum\", "
                       "\"warmup_iters\": 5, \"iters\": 20, \"rows\": [{\"size\": 1048576, \"count\": 262144, "
                       "\"time_us\": 100.000, \"algbw_gbps\": 10.486, \"busbw_gbps\": 10.486, \"wrong\": 0}], "
                       "\"avg_busbw_gbps\": 10.486}}\n"));
}

TEST_CASE("an all-reduce row's time, algbw and busbw follow nccl-tests' arithmetic") {
  AllReduceRow row;
  row.bytes = 1 << 20;
  time_allreduce_row(row, 1.0, 10, 4);  // 10 all-reduces in 1 ms
  CHECK(row.time_us == doctest::Approx(100.0));
  CHECK(row.algbw_gbps == doctest::Approx(10.48576));
  CHECK(row.busbw_gbps == doctest::Approx(10.48576 * 2 * 3 / 4));
  time_allreduce_row(row, 1.0, 10, 1);
  CHECK(row.busbw_gbps == 0.0);
}

TEST_CASE("bytes_text and device_label, as the report and the problems word them") {
  CHECK(doctor::bytes_text(8) == "8 B");
  CHECK(doctor::bytes_text(16 << 20) == "16 MiB");
  CHECK(doctor::bytes_text(1.5 * (1 << 30)) == "1.5 GiB");
  DoctorReport r;
  DoctorGpu g;
  g.index = 3;
  CHECK(doctor::device_label(r, &g, 0) == "GPU 3");
  r.cuda_visible_devices_set = true;
  CHECK(doctor::device_label(r, &g, 0) == "GPU 3 (cuda:0)");
  g.index = -1;
  CHECK(doctor::device_label(r, &g, 2) == "CUDA device 2");
}
