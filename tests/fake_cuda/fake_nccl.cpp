// fake_nccl.cpp — test fake: stands in for libnccl.so.2 (NVIDIA's NCCL) across the GPUs
// of a node, which this machine does not have. It is NOT NVIDIA's library: it works on the
// fake CUDA runtime's "device memory" (tests/fake_cuda/fake_cudart.cpp), which is host
// memory, and moves no data over any link. Tests point airhost at it with
// AIRHOST_NCCL_LIBRARY=<path of libfake-nccl.so>.
//
// What it does, with NCCL's C signatures and result codes:
//   ncclCommInitAll   one communicator per listed device, all in one clique.
//   ncclGroupStart/End  collect the all-reduces issued in between; at the outermost
//                     ncclGroupEnd each clique's all-reduce runs, once every rank of it has
//                     issued one with the same count, as NCCL requires (a rank missing is
//                     ncclInvalidUsage: real NCCL would hang).
//   ncclAllReduce     float32 sum only: every rank's recvbuff gets the element-wise sum of
//                     all ranks' sendbuffs, so tests can check the reduced values. Outside a
//                     group only a 1-rank clique may call it (several would deadlock NCCL).
// Knobs:
//   AIRHOST_FAKE_NCCL_FAIL_INIT=1  ncclCommInitAll fails with ncclSystemError.
//   AIRHOST_FAKE_NCCL_WRONG=1      the last rank's result is off by one (a broken link).
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using ncclResult_t = int;
constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;

constexpr int ncclFloat32 = 7;  // ncclDataType_t
constexpr int ncclSum = 0;      // ncclRedOp_t

struct Clique {
  int nranks = 0;
  int live = 0;  // communicators not yet destroyed
};

struct FakeComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
};

struct PendingAllReduce {
  const float* send;
  float* recv;
  size_t count;
  FakeComm* comm;
};

int g_group_depth = 0;
std::vector<PendingAllReduce> g_pending;
std::string g_last_error;

ncclResult_t fail(ncclResult_t rc, const std::string& why) {
  g_last_error = "fake NCCL: " + why;
  return rc;
}

bool env_is_1(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

// Runs the all-reduces of one clique: ops[r] is rank r's.
ncclResult_t reduce(const std::vector<const PendingAllReduce*>& ops) {
  const size_t count = ops.front()->count;
  for (const auto* op : ops) {
    if (op->count != count) return fail(ncclInvalidUsage, "ranks of one all-reduce gave different counts");
  }
  std::vector<float> sum(count, 0.0f);
  for (const auto* op : ops) {
    for (size_t i = 0; i < count; ++i) sum[i] += op->send[i];
  }
  for (const auto* op : ops) std::memcpy(op->recv, sum.data(), count * sizeof(float));
  if (env_is_1("AIRHOST_FAKE_NCCL_WRONG")) {
    for (size_t i = 0; i < count; ++i) ops.back()->recv[i] += 1.0f;
  }
  return ncclSuccess;
}

ncclResult_t run_pending() {
  std::vector<PendingAllReduce> pending;
  pending.swap(g_pending);
  std::map<Clique*, std::vector<const PendingAllReduce*>> by_clique;
  for (const auto& op : pending) {
    auto& ops = by_clique[op.comm->clique.get()];
    if (ops.empty()) ops.assign(static_cast<size_t>(op.comm->clique->nranks), nullptr);
    if (ops[op.comm->rank]) {
      return fail(ncclInvalidUsage, "a rank issued two all-reduces in one group (not supported by the fake)");
    }
    ops[op.comm->rank] = &op;
  }
  for (auto& [clique, ops] : by_clique) {
    for (const auto* op : ops) {
      if (!op) {
        return fail(ncclInvalidUsage, "not every rank of the communicator joined the all-reduce; "
                                      "real NCCL would hang");
      }
    }
    if (ncclResult_t rc = reduce(ops); rc != ncclSuccess) return rc;
  }
  return ncclSuccess;
}

}  // namespace

#define FAKE_NCCL_API extern "C" __attribute__((visibility("default")))

FAKE_NCCL_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = 22105;  // 2.21.5
  return ncclSuccess;
}

FAKE_NCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case 1: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 3: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    default: return "unknown result code";
  }
}

FAKE_NCCL_API const char* ncclGetLastError(void* /*comm*/) { return g_last_error.c_str(); }

FAKE_NCCL_API ncclResult_t ncclCommInitAll(void** comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll needs comms and ndev >= 1");
  if (env_is_1("AIRHOST_FAKE_NCCL_FAIL_INIT")) {
    return fail(ncclSystemError, "AIRHOST_FAKE_NCCL_FAIL_INIT=1 makes ncclCommInitAll fail");
  }
  auto clique = std::make_shared<Clique>();
  clique->nranks = ndev;
  clique->live = ndev;
  for (int r = 0; r < ndev; ++r) {
    comms[r] = new FakeComm{clique, r, devlist ? devlist[r] : r};
  }
  return ncclSuccess;
}

FAKE_NCCL_API ncclResult_t ncclCommDestroy(void* comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommDestroy of a null communicator");
  auto* c = static_cast<FakeComm*>(comm);
  --c->clique->live;
  delete c;
  return ncclSuccess;
}

FAKE_NCCL_API ncclResult_t ncclCommCount(const void* comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = static_cast<const FakeComm*>(comm)->clique->nranks;
  return ncclSuccess;
}

FAKE_NCCL_API ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}

FAKE_NCCL_API ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  return run_pending();
}

FAKE_NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         int datatype, int op, void* comm, void* /*stream*/) {
  if (!comm || (count && (!sendbuff || !recvbuff))) {
    return fail(ncclInvalidArgument, "ncclAllReduce with a null buffer or communicator");
  }
  if (datatype != ncclFloat32 || op != ncclSum) {
    return fail(ncclInvalidArgument, "the fake reduces only ncclFloat32 (7) with ncclSum (0)");
  }
  auto* c = static_cast<FakeComm*>(comm);
  PendingAllReduce pending{static_cast<const float*>(sendbuff), static_cast<float*>(recvbuff), count, c};
  if (g_group_depth > 0) {
    g_pending.push_back(pending);
    return ncclSuccess;
  }
  if (c->clique->nranks != 1) {
    return fail(ncclInvalidUsage, "an all-reduce of several ranks from one thread outside "
                                  "ncclGroupStart/End would deadlock NCCL");
  }
  return reduce({&pending});
}

// Each entry point airhost resolves takes the calls airhost makes (host/gpu/nvidia_api.hpp, itself
// checked against NVIDIA's headers by tests/abi/check_gpu_abi.cpp).
#include "abi_compat.hpp"
#include "gpu/nvidia_api.hpp"
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclGetVersion);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclGetErrorString);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclGetLastError);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclCommInitAll);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclCommDestroy);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclGroupStart);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclGroupEnd);
AIRHOST_CHECK_AGAINST_GPU_ABI(ncclAllReduce);
