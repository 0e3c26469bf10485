// doctor_report.cpp — the doctor's verdict (exit code and summary) and its report: text for
// people, nvidia-smi and nccl-tests style, and one JSON object for machines.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "airhost/exit_code.hpp"
#include "gpu/doctor_parts.hpp"
#include "base/util.hpp"

namespace airhost::detail::doctor {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(out.data(), out.size(), fmt, ap);
  va_end(ap);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string device_label(const DoctorReport& r, const DoctorGpu* g, int cuda_device) {
  if (!g || g->index < 0) return "CUDA device " + std::to_string(cuda_device);
  std::string label = "GPU " + std::to_string(g->index);
  if (r.cuda_visible_devices_set && g->index != cuda_device) label += " (cuda:" + std::to_string(cuda_device) + ")";
  return label;
}

std::string no_gpu_reason(const DoctorReport& r) {
  if (!r.nvml_loaded) return r.nvml_error.empty() ? "NVML could not be used" : r.nvml_error;
  if (r.node_gpu_count == 0) return "the NVIDIA driver is loaded but NVML lists no GPU";
  std::string why = "CUDA_VISIBLE_DEVICES='" + r.cuda_visible_devices + "' hides all " +
                    std::to_string(r.node_gpu_count) + " of the node's GPUs";
  if (!r.nvml_error.empty()) why += " (" + r.nvml_error + ")";
  return why;
}

void conclude(DoctorReport& r, bool gpus_usable) {
  if (!gpus_usable) {
    r.exit_code = to_int(ExitCode::no_accelerator);
    r.summary = "No usable NVIDIA GPU on this node: " + no_gpu_reason(r) +
                ". airhost will run CPU ranks here (torch.distributed's gloo backend).";
    return;
  }
  if (!r.problems.empty()) {
    r.library_missing = std::all_of(r.problems.begin(), r.problems.end(), [&](const std::string& p) {
      return (!r.cudart.loaded && p == r.cudart.error) || (!r.nccl.loaded && p == r.nccl.error);
    });
    r.exit_code = to_int(ExitCode::preflight_failed);
    r.summary = std::to_string(r.problems.size()) + " check" + (r.problems.size() == 1 ? "" : "s") +
                " failed on " + std::to_string(r.gpus.size()) + " GPU(s): " + r.problems.front();
    return;
  }
  r.exit_code = to_int(ExitCode::ok);
  r.summary = format("All checks passed on %zu GPU(s)", r.gpus.size());
  if (!r.accelerator_type.empty()) r.summary += " (" + r.accelerator_type + ")";
  if (r.allreduce_ran && !r.allreduce.empty()) {
    const AllReduceRow& last = r.allreduce.back();
    const std::string at = bytes_text(static_cast<double>(last.bytes));
    if (r.allreduce_ranks == 1) {
      r.summary += format(": NCCL all-reduce algbw %.2f GB/s at %s (one GPU: busbw is 0)", last.algbw_gbps, at.c_str());
    } else {
      r.summary += format(": NCCL all-reduce busbw %.2f GB/s at %s", last.busbw_gbps, at.c_str());
    }
  }
  r.summary += ".";
}

}  // namespace airhost::detail::doctor

namespace airhost::detail {

namespace {

using doctor::format;
using doctor::bytes_text;
using doctor::no_gpu_reason;

std::string num(double v) { return std::isfinite(v) ? format("%.3f", v) : "null"; }
std::string boolean(bool b) { return b ? "true" : "false"; }

std::string json_library(const LibraryStatus& l) {
  return "{\"loaded\": " + boolean(l.loaded) + ", \"path\": " + json_quoted(l.path) + ", \"version\": " + json_quoted(l.version) +
         ", \"error\": " + json_quoted(l.error) + "}";
}

std::string json_strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_quoted(v[i]);
  return out + "]";
}

}  // namespace

std::string doctor_text(const DoctorReport& r) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };

  if (r.exit_code == to_int(ExitCode::no_accelerator)) {
    line("No usable NVIDIA GPU on this node.");
    line("  Why: " + no_gpu_reason(r));
    if (r.nvml_loaded) {
      line("  NVIDIA driver " + r.driver_version + ", " + std::to_string(r.node_gpu_count) + " GPU(s) on the node.");
    }
    auto found = [](const LibraryStatus& l) {
      if (l.loaded) return (l.version.empty() ? std::string("?") : l.version) + " (" + l.path + ")";
      return l.error.find(" not found ") != std::string::npos ? std::string("not found") : l.error;
    };
    if (r.cudart.loaded || !r.cudart.error.empty()) {
      std::string cudart = found(r.cudart);
      if (!r.cuda_device_error.empty()) cudart += "; " + r.cuda_device_error;
      line("  CUDA runtime: " + cudart);
      line("  NCCL:         " + found(r.nccl));
      line("  cuBLAS:       " + found(r.cublas));
      if (!r.nvml_loaded && (r.cudart.loaded || r.nccl.loaded)) {
        line("  The CUDA libraries are here but no NVIDIA driver is. If this node has GPUs and this is a");
        line("  container, start it with them (docker run --gpus all; on Kubernetes, ask for nvidia.com/gpu).");
      }
    }
    line("  airhost will run CPU ranks here (torch.distributed's gloo backend): --accelerators N starts N");
    line("  of them, 1 by default.");
    line(format("airhost doctor: exit code %d (no accelerator)", r.exit_code));
    return out;
  }

  // GPUs
  line(format("NVIDIA driver %s (CUDA %s), %zu GPU(s) visible of %d on the node%s",
              r.driver_version.empty() ? "?" : r.driver_version.c_str(),
              r.cuda_driver_version.empty() ? "?" : r.cuda_driver_version.c_str(), r.gpus.size(),
              r.node_gpu_count,
              r.cuda_visible_devices_set ? (" (CUDA_VISIBLE_DEVICES=" + r.cuda_visible_devices + ")").c_str() : ""));
  size_t name_width = 4;
  for (const auto& g : r.gpus) name_width = std::max(name_width, g.name.size());
  line(format("  %-4s %-5s %-*s %10s  %-6s %s", "GPU", "CUDA", static_cast<int>(name_width), "Name", "Memory",
              "Model", "Bus ID"));
  for (const auto& g : r.gpus) {
    line(format("  %-4s %-5s %-*s %10s  %-6s %s", g.index < 0 ? "-" : std::to_string(g.index).c_str(),
                g.cuda_device < 0 ? "-" : std::to_string(g.cuda_device).c_str(), static_cast<int>(name_width),
                g.name.c_str(), format("%.1f GiB", g.memory_total / 1073741824.0).c_str(),
                g.model.empty() ? "?" : g.model.c_str(), g.pci_bus_id.empty() ? "?" : g.pci_bus_id.c_str()));
  }
  line("Accelerator type: " + (r.accelerator_type.empty() ? std::string("none in the table (see the notes)")
                                                          : r.accelerator_type));

  // Topology, as nvidia-smi topo -m.
  if (!r.topology.empty()) {
    line("");
    line("Topology (as nvidia-smi topo -m):");
    std::vector<std::string> labels;
    for (const auto& g : r.gpus) labels.push_back(g.index < 0 ? "?" : "GPU" + std::to_string(g.index));
    std::string header = format("%-8s", "");
    for (size_t j = 0; j < r.topology.size(); ++j) header += format("%-8s", labels[j].c_str());
    while (!header.empty() && header.back() == ' ') header.pop_back();
    line(header);
    for (size_t i = 0; i < r.topology.size(); ++i) {
      std::string row = format("%-8s", labels[i].c_str());
      for (const auto& cell : r.topology[i]) row += format("%-8s", cell.c_str());
      while (!row.empty() && row.back() == ' ') row.pop_back();
      line(row);
    }
    line("Legend:");
    line("  X    = Self");
    line("  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes");
    line("  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node");
    line("  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)");
    line("  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)");
    line("  PIX  = Connection traversing at most a single PCIe bridge");
    line("  NV#  = Connection traversing a bonded set of # NVLinks");
  }

  // Libraries
  line("");
  auto lib_line = [&](const char* name, const LibraryStatus& l) {
    if (l.loaded) {
      line(format("%-13s %s (%s)", name, l.version.empty() ? "?" : l.version.c_str(), l.path.c_str()));
    } else if (!l.error.empty()) {
      line(format("%-13s MISSING: %s", name, l.error.c_str()));
    } else {
      line(format("%-13s not checked", name));
    }
  };
  lib_line("CUDA runtime:", r.cudart);
  lib_line("NCCL:", r.nccl);
  lib_line("cuBLAS:", r.cublas);

  // Memory and compute
  bool any_memory = false;
  for (const auto& g : r.gpus) any_memory |= g.memory_checked;
  if (any_memory) {
    line("");
    line(format("Memory and compute per GPU (cudaMalloc %s, device-to-device copy x%d, FP32 SGEMM %d^3 x%d):",
                bytes_text(static_cast<double>(r.memory_bytes)).c_str(), r.copy_iters, r.gemm_n, r.gemm_iters));
    line(format("  %-4s %-6s %16s %16s", "GPU", "Memory", "Copy (GB/s)", "SGEMM (TFLOP/s)"));
    for (const auto& g : r.gpus) {
      if (!g.memory_checked) continue;
      std::string gemm = g.gemm_ran ? format("%.2f", g.gemm_tflops) : (g.gemm_error.empty() ? "skipped" : "FAILED");
      line(format("  %-4s %-6s %16s %16s", g.index < 0 ? "-" : std::to_string(g.index).c_str(),
                  g.memory_ok ? "ok" : "FAILED", g.memory_ok ? format("%.1f", g.copy_gbps).c_str() : "-",
                  gemm.c_str()));
    }
  }

  // All-reduce, as nccl-tests prints it.
  if (!r.allreduce.empty()) {
    line("");
    line(format("NCCL all-reduce across %d GPU(s) in this process (ncclCommInitAll; float sum, out of place; "
                "%d warm-up + %d timed iterations):",
                r.allreduce_ranks, r.warmup_iters, r.iters));
    line(format("#%12s %14s %9s %7s %10s %8s %8s %7s", "size", "count", "type", "redop", "time", "algbw", "busbw",
                "#wrong"));
    line(format("#%12s %14s %9s %7s %10s %8s %8s %7s", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""));
    for (const auto& row : r.allreduce) {
      line(format(" %12zu %14zu %9s %7s %10.2f %8.2f %8.2f %7ld", row.bytes, row.count, "float", "sum", row.time_us,
                  row.algbw_gbps, row.busbw_gbps, row.wrong));
    }
    line(format("# Avg bus bandwidth    : %.2f GB/s%s", r.avg_busbw_gbps,
                r.allreduce_ranks == 1 ? " (one GPU: busbw = algbw x 2(n-1)/n is 0; see algbw)" : ""));
  }

  if (!r.notes.empty()) {
    line("");
    for (const auto& n : r.notes) line("Note: " + n);
  }
  if (!r.problems.empty()) {
    line("");
    for (const auto& p : r.problems) line("FAILED: " + p);
  }
  line("");
  line("airhost doctor: " + r.summary);
  return out;
}

std::string doctor_json(const DoctorReport& r) {
  std::string o = "{";
  o += "\"exit_code\": " + std::to_string(r.exit_code);
  o += ", \"ok\": " + boolean(r.exit_code == 0);
  o += ", \"summary\": " + json_quoted(r.summary);
  o += ", \"problems\": " + json_strings(r.problems);
  o += ", \"notes\": " + json_strings(r.notes);
  o += ", \"nvml_loaded\": " + boolean(r.nvml_loaded);
  o += ", \"nvml_error\": " + json_quoted(r.nvml_error);
  o += ", \"driver_version\": " + json_quoted(r.driver_version);
  o += ", \"cuda_driver_version\": " + json_quoted(r.cuda_driver_version);
  o += ", \"node_gpu_count\": " + std::to_string(r.node_gpu_count);
  o += ", \"cuda_visible_devices\": " + (r.cuda_visible_devices_set ? json_quoted(r.cuda_visible_devices) : "null");
  o += ", \"accelerator_type\": " + (r.accelerator_type.empty() ? std::string("null") : json_quoted(r.accelerator_type));
  o += ", \"accelerators_toml\": " + json_quoted(r.accelerators_toml);
  o += ", \"gpus\": [";
  for (size_t i = 0; i < r.gpus.size(); ++i) {
    const auto& g = r.gpus[i];
    o += i ? ", {" : "{";
    o += "\"index\": " + std::to_string(g.index);
    o += ", \"cuda_device\": " + std::to_string(g.cuda_device);
    o += ", \"name\": " + json_quoted(g.name);
    o += ", \"uuid\": " + json_quoted(g.uuid);
    o += ", \"pci_bus_id\": " + json_quoted(g.pci_bus_id);
    o += ", \"memory_total\": " + std::to_string(g.memory_total);
    o += ", \"model\": " + json_quoted(g.model);
    o += ", \"memory_check\": {\"ran\": " + boolean(g.memory_checked) + ", \"ok\": " + boolean(g.memory_ok) +
         ", \"bytes\": " + std::to_string(g.memory_checked ? r.memory_bytes : 0) +
         ", \"copy_gbps\": " + num(g.copy_gbps) + ", \"error\": " + json_quoted(g.memory_error) + "}";
    o += ", \"compute_check\": {\"ran\": " + boolean(g.gemm_ran) + ", \"n\": " + std::to_string(r.gemm_n) +
         ", \"sgemm_tflops\": " + num(g.gemm_tflops) + ", \"error\": " + json_quoted(g.gemm_error) + "}";
    o += "}";
  }
  o += "]";
  o += ", \"topology\": {\"gpus\": [";
  for (size_t i = 0; i < r.topology.size() && i < r.gpus.size(); ++i) {
    o += (i ? ", " : "") + std::to_string(r.gpus[i].index);
  }
  o += "], \"matrix\": [";
  for (size_t i = 0; i < r.topology.size(); ++i) o += (i ? ", " : "") + json_strings(r.topology[i]);
  o += "]}";
  o += ", \"cuda_runtime\": " + json_library(r.cudart);
  o += ", \"cuda_device_count\": " + std::to_string(r.cuda_device_count);
  o += ", \"cuda_device_error\": " + json_quoted(r.cuda_device_error);
  o += ", \"nccl\": " + json_library(r.nccl);
  o += ", \"cublas\": " + json_library(r.cublas);
  o += ", \"allreduce\": {\"ran\": " + boolean(r.allreduce_ran) + ", \"ranks\": " + std::to_string(r.allreduce_ranks) +
       ", \"type\": \"float\", \"op\": \"sum\", \"warmup_iters\": " + std::to_string(r.warmup_iters) +
       ", \"iters\": " + std::to_string(r.iters) + ", \"rows\": [";
  for (size_t i = 0; i < r.allreduce.size(); ++i) {
    const auto& row = r.allreduce[i];
    o += (i ? ", " : "") + format("{\"size\": %zu, \"count\": %zu, \"time_us\": %s, \"algbw_gbps\": %s, "
                                  "\"busbw_gbps\": %s, \"wrong\": %ld}",
                                  row.bytes, row.count, num(row.time_us).c_str(), num(row.algbw_gbps).c_str(),
                                  num(row.busbw_gbps).c_str(), row.wrong);
  }
  o += "], \"avg_busbw_gbps\": " + num(r.avg_busbw_gbps) + "}";
  o += "}\n";
  return o;
}

}  // namespace airhost::detail
