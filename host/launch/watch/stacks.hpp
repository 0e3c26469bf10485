// stacks.hpp — every rank's Python stacks, on demand: the dump a rank writes when asked, read
// back, grouped (ranks whose main threads stand in the same place are shown
// once, the odd ones out first), and shown as text or JSON. Pure: no loop, no processes
// (stacks_service.hpp asks the ranks and collects).
//
// The rank's side (runtime/rank_module.cpp, installed by bootstrap.py in cold and warm ranks
// alike): a thread of its own reads each request's number on the control channel and
// rewrites <run_dir>/stacks/rank-N.dump without the GIL (CPython's _Py_DumpTracebackThreads,
// what faulthandler uses), so a rank stuck in a C call that holds the GIL answers too, and no
// signal cuts short what the rank's threads are blocked in:
//
//   airhost-stacks seq=7 pid=4242 main=139871234567
//   Thread 0x00007f... (most recent call first):
//     File "/x/train.py", line 12 in load_batch
//     ...
//   airhost-stacks-end seq=7
//
// `seq` is the host's request number, so a dump left by an earlier request
// is never taken for this one's; `main` is the main thread's id.
#pragma once

#include <signal.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/util.hpp"  // rank_ranges

namespace airhost::detail {

inline constexpr const char* kStacksHeader = "airhost-stacks ";
inline constexpr const char* kStacksEnd = "airhost-stacks-end ";

struct StackFrame {
  std::string file;
  int line = -1;  // -1: CPython could not tell
  std::string function;
};

struct ThreadStack {
  unsigned long long id = 0;
  bool main = false;     // the interpreter's main thread (where the training loop runs)
  bool current = false;  // the thread that wrote the dump (none: a thread of airhost's own does)
  bool truncated = false;
  std::vector<StackFrame> frames;  // innermost first, as CPython writes them
};

// One rank's answer, or what /proc says of a rank that gave none.
struct RankStacks {
  int rank = 0;
  int local_rank = 0;
  int node = 0;
  int pid = 0;
  bool answered = false;
  std::string status;  // when not answered: "exited", or "no answer within 3 s"
  std::string proc_state;  // /proc/PID/stat's state letter and name, e.g. "S (sleeping)"
  std::string wchan;       // /proc/PID/wchan
  std::string error;       // what CPython said instead of a stack, if anything
  std::vector<ThreadStack> threads;  // main thread first
  // CPU time of the rank's process group, in clock ticks, when the node that took the stacks
  // measured it (another node's ranks: node 0's hang watch needs it); -1 otherwise.
  long long cpu_ticks = -1;
};

// The dump in `text` answering request `seq`, parsed; nullopt while its end line is not there
// (the rank is still writing it, or has not begun).
std::optional<RankStacks> parse_dump(std::string_view text, unsigned seq);

// Ranks' stacks as one node sends them to node 0 over the node link (node_link.hpp), at most
// `cap` bytes: past it, idle threads lose their frames, then every stack keeps its innermost
// kLinkFrames (marked truncated), so that an answer always fits a link frame.
std::string encode_rank_stacks(const std::vector<RankStacks>& ranks, std::size_t cap);
// Throws FrameError (frames.hpp) when `payload` is not what encode_rank_stacks makes.
std::vector<RankStacks> decode_rank_stacks(std::string_view payload);

// A thread that only waits for work: no Python frame at all, or its innermost frame in
// threading.py, queue.py or selectors.py (a lock, a condition, a queue, a selector). The main
// thread is never idle: where it waits is the answer.
bool is_idle(const ThreadStack& t);

// "file:line in function" of the innermost frame; "(no Python frame)" when there is none.
std::string frame_text(const StackFrame& f);
std::string where_text(const ThreadStack& t);
const ThreadStack* main_thread(const RankStacks& r);

// A group's ranks as JSON fields: `"ranks": [0, 1, 2], "ranges": "0-2"` (the JSON answers').
std::string group_ranks_fields(const std::vector<int>& ranks);

// Items (ranks' stacks, ranks' profiles: anything with a `rank`) in groups of equal key(item):
// the smallest groups first (the odd ones out); among groups of one size, those whose first item
// waits(item) (in torch.distributed: they wait for the others) last; then by lowest rank. Each
// group: indexes into `items`, by rank.
template <typename T, typename Key, typename Waits>
std::vector<std::vector<std::size_t>> odd_ones_first(const std::vector<T>& items, Key key, Waits waits) {
  std::map<std::string, std::vector<std::size_t>> by_key;
  for (std::size_t i = 0; i < items.size(); ++i) by_key[key(items[i])].push_back(i);
  std::vector<std::vector<std::size_t>> groups;
  for (auto& [k, members] : by_key) {
    std::sort(members.begin(), members.end(), [&](auto a, auto b) { return items[a].rank < items[b].rank; });
    groups.push_back(std::move(members));
  }
  std::sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
    if (a.size() != b.size()) return a.size() < b.size();
    const bool wa = waits(items[a.front()]), wb = waits(items[b.front()]);
    if (wa != wb) return wb;
    return items[a.front()].rank < items[b.front()].rank;
  });
  return groups;
}

// Ranks whose main threads stand in the same place (every frame, file, line and function)
// are one group; ranks that gave no answer group by their /proc state. Smallest groups first
// (the odd ones out); among groups of one size, those waiting in torch.distributed last (they
// wait for the others); then by lowest rank. Each group: indexes into `ranks`.
std::vector<std::vector<std::size_t>> group_ranks(const std::vector<RankStacks>& ranks);

struct StacksSnapshot {
  std::string run_id;
  double taken_at = 0;
  std::string file;  // the full stacks in the run directory; empty when it could not be written
  std::vector<RankStacks> ranks;  // by rank
};

// The grouped summary for a terminal. Each group: its ranks, where their main thread is and
// its stack (innermost first), each rank's node and pid; and, per rank, the other threads that
// are not idle (all of them with `all_threads`).
std::string render_text(const StacksSnapshot& s, bool all_threads);
// The same as data (every thread, idle ones marked): run_id, taken_at, file, groups, ranks.
std::string render_json(const StacksSnapshot& s);
// Everything, for <run_dir>/stacks/<time>.txt: the summary, then every thread of every rank.
std::string render_full(const StacksSnapshot& s);

}  // namespace airhost::detail
