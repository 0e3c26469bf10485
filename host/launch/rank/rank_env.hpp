// rank_env.hpp — the ONE place a rank's environment is built.
#pragma once

#include <string>
#include <vector>

#include "airhost/launch.hpp"

namespace airhost::detail {

// NCCL's flight recorder on GPU runs: how many collectives each rank keeps, and the name its
// dump gets in <run_dir>/stacks/ (torch appends the global rank).
inline constexpr const char* kFlightRecorderEntries = "2000";
inline constexpr const char* kFlightRecorderPrefix = "nccl-trace-rank-";

// Facts about this run that every rank's environment carries.
struct RunContext {
  std::string run_id;
  std::string run_dir;
  int master_port = 0;
  int host_pid = 0;
  int control_fd = 3;  // where the rank finds its control channel
  int restart_count = 0;  // 0 for the first attempt, then 1, 2, ... (LaunchSpec::max_restarts)
};

// Returns the environment ("KEY=VALUE") of local rank `local_rank`, in this order, later
// entries overriding earlier ones:
//
//   1. `base` — the caller's environment (when spec.inherit_env), so PATH, venv variables,
//      credentials and NCCL_* settings reach the ranks unchanged;
//   2. defaults that apply only when the caller did not set them:
//        OMP_NUM_THREADS=1        N ranks × all cores of threads would oversubscribe the CPU
//                                 (torchrun does the same);
//        TORCH_NCCL_ASYNC_ERROR_HANDLING=1   as torchrun's agent sets it: a failed or timed-out
//                                 NCCL collective aborts the communicator, then the process,
//                                 instead of tearing down without the abort (torch's default 3);
//   3. what airhost decides, always:
//        PYTHONUNBUFFERED=1       output reaches the host (and the user) as it is printed;
//        RANK                     global rank = node_rank * nprocs + local_rank
//        LOCAL_RANK               index on this node (and into CUDA_VISIBLE_DEVICES)
//        WORLD_SIZE               nnodes * nprocs
//        LOCAL_WORLD_SIZE         nprocs
//        GROUP_RANK               node_rank          \ torchrun's names, so code written
//        ROLE_RANK                = RANK              | for torchrun, Lightning or HF
//        ROLE_WORLD_SIZE          = WORLD_SIZE        | accelerate runs unchanged
//        ROLE_NAME                "default"          /
//        MASTER_ADDR, MASTER_PORT where rank 0 serves the rendezvous store
//        TORCHELASTIC_RUN_ID      = AIRHOST_RUN_ID
//        TORCHELASTIC_RESTART_COUNT  0, then 1, 2, ... after each restart of the group, so a
//                                 script knows to resume from its last checkpoint
//        TORCHELASTIC_MAX_RESTARTS   spec.max_restarts
//        TORCHELASTIC_USE_AGENT_STORE=False  rank 0 serves the rendezvous store, not an agent; a
//                                 caller that is itself a torchrun worker has True, which
//                                 would leave every rank waiting for a store nobody serves
//        AIRHOST_RUN_ID, AIRHOST_RUN_DIR    the run's id and directory (logs, run.json)
//        AIRHOST_HOST_PID         the host's pid: the rank dies with it
//        AIRHOST_CONTROL_FD       the control channel's descriptor
//        COLUMNS, LINES           only when the caller's terminal is known (OutputOptions::
//                                 terminal_columns): its width less the rank prefix, and its
//                                 height, for what sizes itself to the terminal; and, unless
//                                 set, TQDM_NCOLS one less (tqdm does not read COLUMNS)
//        CUDA_VISIBLE_DEVICES     the run's GPUs, only when spec.devices is not empty, with
//        CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers them as NVML does, and, unless the
//                                 user set them, NCCL's flight recorder (docs/hangs.md):
//                                 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 (not with TORCH_FR_BUFFER_SIZE),
//                                 TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_FR_DUMP_TEMP_FILE=
//                                 <run_dir>/stacks/nccl-trace-rank- (torch adds the rank; not
//                                 with TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
//   4. spec.env — the user's explicit extra variables, last, so they can override anything.
//
// Variables airhost never sets but a rank reads, for the user to set (step 1 or 4):
//        AIRHOST_RESULT_SHM_LIMIT  bytes of shared memory a function rank's result may take
//                                 before it goes to an unnamed file in the run dir's results/
//                                 (default: half the memory available, shared among the ranks)
//        AIRHOST_RANK_FINALIZE=1  a function rank runs the full Py_FinalizeEx after returning,
//                                 instead of atexit, thread joins and flushes, then _exit
std::vector<std::string> build_rank_env(const LaunchSpec& spec, int local_rank, const RunContext& ctx,
                                        const std::vector<std::string>& base);

// "[rank 3] " — the prefix of a rank's forwarded lines.
std::string rank_prefix(int rank);

}  // namespace airhost::detail
