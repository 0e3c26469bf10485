// flight_recorder.hpp — torch's flight recorder, read back after a run that did not succeed.
//
// GPU ranks get the recorder by default (rank_env.hpp): on an NCCL timeout each rank dumps its
// ring of recent collectives into <run_dir>/stacks/nccl-trace-rank-N. When a run ends badly and
// such dumps are there, the host runs runtime/flight_recorder.py (compiled in, standard library
// only) with the ranks' Python over them and puts its few lines into the failure summary and
// stacks/flight-recorder.txt: which collective each process group reached, which rank never
// entered it, where the ranks disagree.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace airhost::detail {

// On demand (a hang the watch found, the timeout): NCCL's monitor thread in each GPU rank
// listens on <stacks_dir>/<prefix>N.pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, set by rank_env)
// and dumps its ring into <prefix>N when it reads a byte there. Writes one byte to each such
// pipe that has a reader, never blocking; returns the ranks asked.
std::vector<int> poke_flight_recorder(const std::string& stacks_dir, const std::string& prefix);
// Which of `ranks` have a dump `prefix`N written at or after `since` (seconds since the epoch).
std::vector<int> flight_recorder_dumped(const std::string& stacks_dir, const std::string& prefix,
                                        const std::vector<int>& ranks, double since);

// Whether `stacks_dir` holds a dump named `prefix`N.
bool has_flight_recorder_dumps(const std::string& stacks_dir, const std::string& prefix);

// The summary, from `python` within `limit`: its lines, or one line saying why there is none
// (the interpreter could not start, it timed out, no dump could be read). "" when there is no
// dump at all.
std::string flight_recorder_summary(const std::string& python, const std::string& stacks_dir,
                                    const std::string& prefix, std::chrono::milliseconds limit);

}  // namespace airhost::detail
