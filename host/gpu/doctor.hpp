// doctor.hpp — `airhost doctor`: is this node fit for multi-GPU training?
//
// What it checks, in order, and what it prints (doctor_text; doctor_json for machines):
//   1. The accelerators, through NVML (dlopen, see accelerators.hpp): model, memory, driver
//      and CUDA driver versions, the accelerator type the node maps to in
//      configs/accelerators.toml (8 x H100 → GPU_8xH100), and the link between each pair
//      of GPUs as `nvidia-smi topo -m` shows it (NV<n>, PIX, PXB, PHB, NODE, SYS).
//   2. The CUDA runtime (libcudart, dlopen): its version and device count; then on every
//      GPU an allocation (1 GiB), a memset, a device-to-device copy (bandwidth, and the
//      copied bytes checked) and, when cuBLAS loads, an FP32 SGEMM of 4096 x 4096 (TFLOP/s).
//   3. NCCL (libnccl, dlopen): ncclCommInitAll over every GPU in this one process, then a
//      float32 sum all-reduce from 8 B to 256 MB (x4 per step) printed like nccl-tests:
//      time, algbw = bytes / time, busbw = algbw * 2 (n - 1) / n, and the values checked.
// Each part is a file of its own, listed in doctor_parts.hpp; the report is doctor_report.cpp.
//
// Nothing CUDA is linked: libnvidia-ml.so.1, libcudart.so*, libnccl.so* and libcublas.so*
// are opened at run time, and a missing one is reported by name. Overrides, used by the
// tests to load fakes: AIRHOST_NVML_LIBRARY, AIRHOST_CUDART_LIBRARY, AIRHOST_NCCL_LIBRARY,
// AIRHOST_CUBLAS_LIBRARY (a path; only that file is tried), AIRHOST_ACCELERATORS_TOML.
//
// Exit codes (DoctorReport::exit_code, and the exit status of `airhost doctor`):
//   0  (ExitCode::ok)               every check passed. A missing cuBLAS only skips the
//                                   compute check, and an unknown accelerator type is a note.
//   3  (ExitCode::no_accelerator)   no GPU is usable: no NVML (no driver), NVML lists none,
//                                   or CUDA_VISIBLE_DEVICES hides them all. airhost then
//                                   runs CPU ranks (gloo); the message says which case.
//   4  (ExitCode::preflight_failed) GPUs exist but a check failed: the CUDA runtime is
//                                   missing or sees no device, an allocation or copy fails,
//                                   NCCL is missing, does not start, fails or reduces
//                                   wrongly. DoctorReport::problems names each failure.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "gpu/libraries.hpp"

namespace airhost::detail {

struct DoctorOptions {
  bool quick = false;               // the --preflight check: fewer sizes, iterations, bytes
  std::vector<std::size_t> sizes;   // all-reduce sizes in bytes; empty: 8 B..256 MB by x4
                                    // (quick: 8 B, 64 KiB, 8 MiB, 64 MiB)
  int warmup_iters = 0;             // per size; 0: 5 (quick 2)
  int iters = 0;                    // timed, per size; 0: 20 (quick 5)
  std::size_t memory_bytes = 0;     // the per-GPU allocation; 0: 1 GiB (quick 256 MiB)
  int gemm_n = 0;                   // SGEMM size n (n x n x n); 0: 4096
};

struct DoctorGpu {
  int index = 0;                 // NVML index
  int cuda_device = -1;          // CUDA ordinal; -1 if the CUDA runtime did not see it
  std::string name;
  std::string uuid;
  std::string pci_bus_id;
  unsigned long long memory_total = 0;  // bytes
  std::string model;             // "H100" from the accelerator table; "" if unknown
  // The memory check: cudaMalloc, cudaMemset, device-to-device cudaMemcpy.
  bool memory_checked = false;
  bool memory_ok = false;
  double copy_gbps = 0;          // device-to-device copy, bytes read + written per second / 1e9
  std::string memory_error;
  // The compute check: cuBLAS SGEMM.
  bool gemm_ran = false;
  double gemm_tflops = 0;
  std::string gemm_error;        // a failure; a skip (no cuBLAS) is a note of the report
};

struct AllReduceRow {
  std::size_t bytes = 0;
  std::size_t count = 0;     // float32 elements
  double time_us = 0;        // per all-reduce, the slowest GPU's
  double algbw_gbps = 0;     // bytes / time
  double busbw_gbps = 0;     // algbw * 2 (n - 1) / n
  long wrong = 0;            // checked elements that do not hold the expected sum
};

struct DoctorReport {
  int exit_code = 0;                  // see the top of this file
  std::string summary;                // one sentence
  std::vector<std::string> problems;  // failed checks, one sentence each (exit code 4)
  std::vector<std::string> notes;     // skipped or partial checks that do not fail the node
  // The only failures are that the CUDA runtime or NCCL could not be found or loaded here:
  // the GPUs themselves went unchecked, and the ranks' torch may bring its own copies.
  bool library_missing = false;

  // NVML
  bool nvml_loaded = false;
  std::string nvml_error;
  std::string driver_version;         // "550.54.15"
  std::string cuda_driver_version;    // "12.4"
  int node_gpu_count = 0;             // before CUDA_VISIBLE_DEVICES
  bool cuda_visible_devices_set = false;
  std::string cuda_visible_devices;
  std::vector<DoctorGpu> gpus;        // the visible ones
  std::string accelerator_type;       // "GPU_8xH100"; "" when the table has none for the node
  std::string accelerators_toml;      // the table that was read
  std::vector<std::vector<std::string>> topology;  // [i][j] over gpus, see GpuTopology

  // Libraries
  // With no usable GPU (exit code 3) the full doctor still loads them, touching no device,
  // to say what the node has; the quick one (--preflight) does not.
  LibraryStatus cudart, nccl, cublas;
  int cuda_device_count = 0;
  std::string cuda_device_error;      // no usable GPU: why the CUDA runtime counted none

  // NCCL all-reduce
  bool allreduce_ran = false;
  int allreduce_ranks = 0;
  int warmup_iters = 0;
  int iters = 0;
  std::vector<AllReduceRow> allreduce;
  double avg_busbw_gbps = 0;
  std::size_t memory_bytes = 0;       // the per-GPU allocation checked
  int copy_iters = 0;                 // timed device-to-device copies per GPU
  int gemm_n = 0;
  int gemm_iters = 0;                 // timed SGEMMs per GPU
};

// Runs every check. Never throws; a failure is in the report. Loads CUDA into this process
// (a context, hundreds of MiB, on every GPU, kept until exit): a long-lived process should
// use run_doctor_in_child.
DoctorReport run_doctor(const DoctorOptions& options);

// The report for people (nvidia-smi / nccl-tests style tables) and for machines (one JSON
// object, one line, ending in a newline).
std::string doctor_text(const DoctorReport& report);
std::string doctor_json(const DoctorReport& report);

// The all-reduce sizes `options` asks for, in bytes: options.sizes, else 8 B to 256 MiB by
// x4 (nccl-tests -b 8 -e 256M -f 4, plus 256 MiB itself), or with quick 8 B, 64 KiB,
// 8 MiB and 64 MiB.
std::vector<std::size_t> allreduce_sizes(const DoctorOptions& options);

// The bus bandwidth nccl-tests reports for an all-reduce of n ranks: algbw * 2 (n - 1) / n.
double allreduce_busbw(double algbw, int ranks);

// One row's figures, as nccl-tests computes them, from `ms` measured for `iters` all-reduces
// of row.bytes over `ranks` GPUs: time_us per all-reduce, algbw_gbps = bytes / time, and
// busbw_gbps as above.
void time_allreduce_row(AllReduceRow& row, double ms, int iters, int ranks);

// The outcome of run_doctor run in a forked child (for --preflight: the host process must
// not keep CUDA contexts on the GPUs its ranks will use, and a hung NCCL must not hang it).
struct DoctorOutcome {
  int exit_code = 0;                  // the child's, or 4 when it hung, crashed or failed
  std::string summary;
  std::vector<std::string> problems;
  bool library_missing = false;       // DoctorReport::library_missing
  std::string text;                   // doctor_text of the child's report
};
// `devices`: the NVML indices to check, given to the child as the ranks get them
// (CUDA_VISIBLE_DEVICES=<indices>, CUDA_DEVICE_ORDER=PCI_BUS_ID); empty: every visible GPU.
DoctorOutcome run_doctor_in_child(const DoctorOptions& options, double timeout_seconds,
                                  const std::vector<int>& devices = {});

}  // namespace airhost::detail
