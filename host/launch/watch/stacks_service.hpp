// stacks_service.hpp — the host's side of `airhost stacks`: asking every rank of this node for
// its Python stacks and collecting the answers, on the supervisor's loop.
//
//   collect():  each live rank that said it watches (FrameKind::stacks_watch; a rank still
//               starting has not) gets the request's number on its control channel; a thread
//               of its own rewrites <run_dir>/stacks/rank-N.dump, and no signal interrupts
//               what the rank's threads are blocked in. A timer reads the dumps
//               every 20 ms until each has its end line or `wait` passed; a rank that did not
//               answer is named with /proc's state and wchan. The snapshot goes to
//               <run_dir>/stacks/<time>.txt (every thread of every rank), then to the callers.
//               Requests that come while one is under way share its answer (a request for
//               every rank does not share one that asks some ranks only: it gets its own).
//   sample():   rounds of collect(), one every interval for a while, made into each rank's
//               profile (stacks_sample.hpp) with its CPU share from /proc; written to
//               <run_dir>/stacks/sample-<time>.txt. One sampling at a time.
//   the socket: <run_dir>/host.sock (0600, in the 0700 run directory; a peer of another uid
//               is refused by SO_PEERCRED). A client writes one line, "stacks [json]
//               [all-threads] [sample=MS]\n", and reads the answer, text or JSON, to EOF
//               ("error: ..." when it cannot be given).
//   other nodes: on node 0 of several, every request also goes to the other nodes through the
//               node link (ask_nodes); each node's host takes its own ranks' stacks as above
//               and sends them back, and take_answer() adds them to the request under way, so
//               the answer, the hang watch and a sampling see the whole job. A node that does
//               not answer within `wait` and kRemoteSlackMs is named for each of its ranks.
#pragma once

#include <sys/un.h>
#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "launch/watch/stacks.hpp"
#include "launch/watch/stacks_sample.hpp"

namespace airhost::detail {

inline constexpr const char* kHostSocketName = "host.sock";
// How much longer node 0 waits for the other nodes' answers than a node waits for its ranks.
inline constexpr long kRemoteSlackMs = 2000;

// One request line of the host's socket (`airhost stacks [--json] [--all-threads] [--sample
// D]` sends it): the words "stacks", "json", "all-threads", "sample=MS", in any order; words it
// does not know are skipped (a newer client's). Pure: bytes from any local process of the
// user's come through it (tests/fuzz/fuzz_stacks_request.cpp).
struct StacksRequest {
  bool stacks = false;      // the request names what it wants; anything else is refused
  bool json = false;
  bool all_threads = false;
  long sample_ms = 0;       // 0: a snapshot; otherwise a sampling that long (may be out of range)
};
StacksRequest parse_stacks_request(std::string_view line);

// A unix socket address for `dir`/`name`, also where the path is longer than sun_path holds
// (a deep run directory): then through /proc/self/fd/N of the directory, opened into
// `dir_fd` (the caller closes it once bound or connected; -1 when not needed). Throws
// std::system_error.
std::size_t socket_address(const std::string& dir, const std::string& name, sockaddr_un& addr, int& dir_fd);

// What /proc says of `pid`: "S (sleeping)" and its wchan; empty when it cannot be read.
std::string proc_state(int pid);
std::string proc_wchan(int pid);

class StacksService {
 public:
  struct Rank {
    int rank = 0;
    int local_rank = 0;
    int pid = 0;
    bool alive = false;
    int request_fd = -1;  // its control channel, once it watches for requests; -1 before
  };
  struct Options {
    uv_loop_t* loop = nullptr;
    std::string run_id;
    std::string run_dir;
    int node = 0;
    std::function<std::vector<Rank>()> ranks;  // this node's ranks, now
    std::chrono::milliseconds wait{3000};      // for the ranks' answers
    // Node 0 of several: sends a request to every other node (the node link). `only`: the
    // ranks asked, null for all.
    std::function<void(unsigned seq, const std::vector<int>* only)> ask_nodes;
    int nnodes = 1;
    int nprocs = 1;  // ranks per node: node n has ranks n*nprocs .. n*nprocs+nprocs-1
  };
  using Done = std::function<void(const StacksSnapshot&)>;

  explicit StacksService(Options options);
  ~StacksService();
  StacksService(const StacksService&) = delete;
  StacksService& operator=(const StacksService&) = delete;

  // Makes <run_dir>/stacks and listens on the socket. Returns why it cannot listen, or "":
  // collect() works either way.
  std::string start();
  // Asks every rank; `done` gets the snapshot on the loop's thread, within `wait` and a tick.
  // `keep`: the snapshot is written to <run_dir>/stacks/<time>.txt (a sample of the hang
  // watch is not, unless another caller of the same request keeps it).
  // `only`: ask these ranks alone (the others are "not asked"); a request already under way
  // asks whom it asks.
  void collect(Done done, bool keep = true, const std::vector<int>* only = nullptr);
  // Samples every rank for `length`, a round every `interval`; `done` gets the profile on the
  // loop's thread. Returns "" when it started, or why not (a sampling is under way).
  using SampleDone = std::function<void(const StacksSample&)>;
  std::string sample(std::chrono::milliseconds length, std::chrono::milliseconds interval, SampleDone done);
  // Node 0: another node's answer to request `seq` (its ranks, as it took them). On the loop's
  // thread; an answer to a request no longer under way is dropped.
  void take_answer(int node, unsigned seq, std::vector<RankStacks> ranks);
  // Closes the socket (removing its file), the timer and every client; pending callers get
  // nothing. Call on the loop's thread before it ends.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airhost::detail
