// doctor_nccl.cpp — the doctor's NCCL check: ncclCommInitAll over every CUDA device of this
// process, then a float32 sum all-reduce per size, timed and its sums checked, with the
// arithmetic nccl-tests reports (algbw, busbw).
#include <algorithm>
#include <exception>

#include "gpu/doctor_parts.hpp"

namespace airhost::detail {

std::vector<std::size_t> allreduce_sizes(const DoctorOptions& o) {
  if (!o.sizes.empty()) return o.sizes;
  if (o.quick) return {8, 64 << 10, 8 << 20, 64 << 20};
  // nccl-tests -b 8 -e 256M -f 4, plus the end itself (8 * 4^k skips 256 MiB).
  std::vector<std::size_t> sizes;
  const std::size_t end = std::size_t{256} << 20;
  for (std::size_t s = 8; s <= end; s *= 4) sizes.push_back(s);
  if (sizes.back() != end) sizes.push_back(end);
  return sizes;
}

double allreduce_busbw(double algbw, int ranks) {
  return ranks > 0 ? algbw * 2.0 * (ranks - 1) / ranks : 0.0;
}

void time_allreduce_row(AllReduceRow& row, double ms, int iters, int ranks) {
  row.time_us = ms * 1e3 / iters;
  row.algbw_gbps = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
  row.busbw_gbps = allreduce_busbw(row.algbw_gbps, ranks);
}

}  // namespace airhost::detail

namespace airhost::detail::doctor {

namespace {

// Device d's all-reduce input: every float is float_of_byte(pattern_byte(d)), a normal
// number between 0.01 and 200, different for neighbouring devices.
unsigned char pattern_byte(int d) { return static_cast<unsigned char>(0x3C + d % 8); }

// NCCL's own messages mostly say to rerun with NCCL_DEBUG; the others get the hint here.
std::string debug_hint(const std::string& message) {
  return message.find("NCCL_DEBUG") == std::string::npos ? "; rerun with NCCL_DEBUG=INFO for NCCL's reasons" : "";
}

}  // namespace

// The all-reduce over every CUDA device, one communicator each, from this one thread.
void check_allreduce(DoctorReport& r, const Cudart& cuda, const Nccl& nccl, const Plan& plan) {
  const int n = r.cuda_device_count;
  r.allreduce_ranks = n;
  size_t max_bytes = 4;
  for (size_t s : plan.sizes) max_bytes = std::max(max_bytes, s);
  max_bytes = (max_bytes + 3) / 4 * 4;

  // Destroyed before the buffers and streams they used (declared after the scope below);
  // after a failure aborted instead, as NCCL asks (a destroy could wait forever).
  struct Communicators {
    const Nccl& nccl;
    std::vector<ncclComm_t> comms;
    bool made = false, failed = false;
    ~Communicators() {
      if (!made) return;
      if (std::uncaught_exceptions() > 0) failed = true;  // a check failed mid-way
      for (auto c : comms) {
        if (!c) continue;
        if (failed && nccl.ncclCommAbort) {
          nccl.ncclCommAbort(c);
        } else {
          nccl.ncclCommDestroy(c);
        }
      }
    }
  };
  try {
    CudaScope scope(cuda);
    Communicators communicators{nccl, std::vector<ncclComm_t>(static_cast<size_t>(n), nullptr)};
    auto& comms = communicators.comms;
    std::vector<float*> send(n), recv(n);
    std::vector<cudaStream_t> streams(n);
    std::vector<cudaEvent_t> starts(n), ends(n);
    double expected = 0;
    for (int d = 0; d < n; ++d) {
      const std::string where = "GPU cuda:" + std::to_string(d);
      cuda_ok(cuda, cuda.cudaSetDevice(d), where + ": cudaSetDevice");
      void* p = nullptr;
      cuda_ok(cuda, scope.alloc(d, &p, max_bytes), where + ": cudaMalloc of the all-reduce input (" + bytes_text(max_bytes) + ")");
      send[d] = static_cast<float*>(p);
      cuda_ok(cuda, scope.alloc(d, &p, max_bytes), where + ": cudaMalloc of the all-reduce output (" + bytes_text(max_bytes) + ")");
      recv[d] = static_cast<float*>(p);
      cuda_ok(cuda, cuda.cudaMemset(send[d], pattern_byte(d), max_bytes), where + ": cudaMemset");
      cuda_ok(cuda, cuda.cudaMemset(recv[d], 0, max_bytes), where + ": cudaMemset");
      cuda_ok(cuda, scope.stream(d, &streams[d]), where + ": cudaStreamCreate");
      cuda_ok(cuda, scope.event(d, &starts[d]), where + ": cudaEventCreate");
      cuda_ok(cuda, scope.event(d, &ends[d]), where + ": cudaEventCreate");
      expected += float_of_byte(pattern_byte(d));
    }
    cuda_ok(cuda, cuda.cudaSetDevice(0), "cudaSetDevice(0)");

    std::vector<int> devlist(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) devlist[d] = d;
    if (ncclResult_t rc = nccl.ncclCommInitAll(comms.data(), n, devlist.data()); rc != ncclSuccess) {
      comms.assign(comms.size(), nullptr);
      throw CheckFailed("NCCL could not start on " + std::to_string(n) + " GPU(s): ncclCommInitAll: " +
                        nccl.describe(rc) + debug_hint(nccl.describe(rc)));
    }
    communicators.made = true;

    double busbw_sum = 0;
    for (size_t bytes_asked : plan.sizes) {
      const size_t count = std::max<size_t>(1, bytes_asked / sizeof(float));
      const size_t bytes = count * sizeof(float);
      auto all_reduce = [&](const char* phase) {
        ncclResult_t rc = nccl.ncclGroupStart();
        for (int d = 0; d < n && rc == ncclSuccess; ++d) {
          rc = nccl.ncclAllReduce(send[d], recv[d], count, ncclFloat32, ncclSum, comms[d], streams[d]);
        }
        ncclResult_t end_rc = nccl.ncclGroupEnd();
        if (rc == ncclSuccess) rc = end_rc;
        if (rc != ncclSuccess) {
          communicators.failed = true;
          throw CheckFailed(format("the NCCL all-reduce of %zu bytes failed (%s): ", bytes, phase) +
                            nccl.describe(rc) + debug_hint(nccl.describe(rc)));
        }
      };
      for (int i = 0; i < plan.warmup; ++i) all_reduce("warm-up");
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaEventRecord(starts[d], streams[d]), "cudaEventRecord");
      }
      for (int i = 0; i < plan.iters; ++i) all_reduce("timed");
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaEventRecord(ends[d], streams[d]), "cudaEventRecord");
      }
      float ms = 0;
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        ms = std::max(ms, elapsed_ms(cuda, starts[d], ends[d], "the all-reduce timing"));
      }

      // Every output element must be the sum of the devices' inputs: look at both ends.
      AllReduceRow row;
      const size_t probe = std::min<size_t>(count, 256);
      std::vector<float> host(probe);
      for (int d = 0; d < n; ++d) {
        cuda_ok(cuda, cuda.cudaSetDevice(d), "cudaSetDevice");
        cuda_ok(cuda, cuda.cudaStreamSynchronize(streams[d]), "cudaStreamSynchronize");
        for (size_t offset : {size_t{0}, count - probe}) {
          cuda_ok(cuda, cuda.cudaMemcpy(host.data(), recv[d] + offset, probe * sizeof(float), cudaMemcpyDeviceToHost),
                  "cudaMemcpy device to host");
          for (float v : host) row.wrong += close_to(v, expected, 1e-4) ? 0 : 1;
          if (offset == count - probe && probe == count) break;  // both ends are the same
        }
      }
      row.bytes = bytes;
      row.count = count;
      time_allreduce_row(row, ms, plan.iters, n);
      busbw_sum += row.busbw_gbps;
      r.allreduce.push_back(row);
      if (row.wrong > 0) {
        r.problems.push_back(format("the NCCL all-reduce of %zu bytes gave wrong sums: %ld of the checked "
                                    "elements differ from %g",
                                    bytes, row.wrong, expected));
      }
    }
    r.allreduce_ran = true;
    if (!r.allreduce.empty()) r.avg_busbw_gbps = busbw_sum / static_cast<double>(r.allreduce.size());
    for (int d = 0; d < n; ++d) {
      cuda.cudaSetDevice(d);
      cuda.cudaStreamSynchronize(streams[d]);
    }
  } catch (const CheckFailed& e) {
    r.problems.push_back(e.what());
  }
}

}  // namespace airhost::detail::doctor
