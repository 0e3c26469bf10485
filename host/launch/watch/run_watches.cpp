#include "launch/watch/run_watches.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "base/files.hpp"
#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/procs/proc_tree.hpp"
#include "launch/rank/frames.hpp"
#include "launch/watch/flight_recorder.hpp"

namespace airhost::detail {
namespace {

// How long the ranks' flight recorders (NCCL) may take to dump before a timeout or a hang stops
// them: their monitor threads look at their pipes about once a second.
constexpr std::uint64_t kFlightRecorderWaitMs = 10000;
// How often the host samples what each rank uses (rank_usage.hpp).
constexpr std::uint64_t kUsageEveryMs = 5000;

}  // namespace

RunWatches::RunWatches(Options options, Host host)
    : o_(std::move(options)), host_(std::move(host)), usage_meter_(::sysconf(_SC_CLK_TCK)) {
  for (uv_timer_t* t : {&hang_timer_, &fr_timer_, &usage_timer_}) {
    uv_timer_init(o_.loop, t);
    t->data = this;
  }
}

RunWatches::~RunWatches() = default;

void RunWatches::start_stacks() {
  StacksService::Options o;
  o.loop = o_.loop;
  o.run_id = o_.context.run_id;
  o.run_dir = o_.context.run_dir;
  o.node = spec().node_rank;
  o.nnodes = spec().nnodes;
  o.nprocs = spec().nprocs;
  if (spec().node_rank == 0) o.ask_nodes = o_.ask_nodes;
  o.ranks = host_.ranks;
  stacks_ = std::make_unique<StacksService>(std::move(o));
  if (const std::string why = stacks_->start(); !why.empty())
    o_.log("airhost stacks cannot reach this run (" + why + "); Ctrl-\\ still shows the stacks");
}

void RunWatches::start_timers() {
  // The hang watch. With several nodes, node 0 alone watches, over every rank of the job (the
  // others answer its requests through the node link): a node's own ranks all waiting in a
  // collective say nothing of who holds them up.
  if (spec().hang_timeout.count() > 0 && stacks_ && (spec().nnodes == 1 || spec().node_rank == 0)) {
    hang_watch_ = std::make_unique<HangWatch>(spec().hang_timeout, ::sysconf(_SC_CLK_TCK));
    const auto every = static_cast<std::uint64_t>(hang_sample_every(spec().hang_timeout).count());
    uv_timer_start(&hang_timer_, [](uv_timer_t* t) {
      auto* self = static_cast<RunWatches*>(t->data);
      self->host_.guarded("the hang watch", [self] { self->sample_for_hangs(); });
    }, every, every);
  }
  // What each rank uses, every kUsageEveryMs (a disk that refuses it costs the series, never the run).
  if (!spec().devices.empty()) {
    gpu_reader_ = std::make_unique<GpuUsageReader>();
    gpu_reader_->request();  // NVML opens meanwhile: the first sample has its figures
  }
  uv_timer_start(&usage_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<RunWatches*>(t->data);
    self->host_.guarded("sampling what the ranks use", [self] { self->sample_usage(); });
  }, kUsageEveryMs, kUsageEveryMs);
}

void RunWatches::close() {
  if (closed_) return;
  closed_ = true;
  for (uv_timer_t* t : {&hang_timer_, &fr_timer_, &usage_timer_}) uv_close(as_handle(t), nullptr);
  if (stacks_) stacks_->close();
}

void RunWatches::say_stacks(const StacksSnapshot& snap, const std::string& headline) {
  host_.end_open_lines();
  if (!headline.empty()) o_.say(headline);
  const std::string text = render_text(snap, false);
  std::size_t at = 0;
  while (at < text.size()) {
    const auto nl = text.find('\n', at);
    o_.say(std::string_view(text).substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    at = nl == std::string::npos ? text.size() : nl + 1;
  }
}

void RunWatches::show_stacks(const std::string& why, std::function<void()> then) {
  if (!has_stacks()) {
    if (then) then();
    return;
  }
  if (!why.empty()) o_.say(why);
  stacks_->collect([this, then = std::move(then)](const StacksSnapshot& snap) {
    host_.guarded("showing the ranks' stacks", [&] {
      say_stacks(snap);
      if (then) then();
    });
  });
}

void RunWatches::at_timeout(std::function<void()> stop) {
  show_stacks("the timeout passed: where each rank is, before they are stopped", [this, stop = std::move(stop)] {
    say_usage();
    ask_flight_recorder(stop, true);
  });
}

void RunWatches::sample_usage() {
  std::vector<std::pair<int, int>> alive;
  for (const auto& r : host_.ranks())
    if (r.alive) alive.push_back({r.rank, r.pid});
  if (alive.empty()) return;
  const auto procs = list_processes();
  const double now = now_seconds();
  last_usage_ = usage_meter_.sample(now, alive, procs, spec().node_rank);
  if (gpu_reader_) {
    // The reading asked for at the last sample (NVML never runs on the loop); one older than
    // two samples means NVML is stuck, and its figures are left out rather than shown stale.
    const auto gpus = gpu_reader_->latest();
    gpu_reader_->request();
    if (gpus && now - gpus->taken_at < 2.5 * kUsageEveryMs / 1000.0) {
      const auto& devices = spec().devices;
      std::map<int, std::vector<int>> members;  // process group (a rank's pid) → its pids
      for (const auto& p : procs) members[p.pgid].push_back(p.pid);
      std::map<int, int> pid_of(alive.begin(), alive.end());  // rank → pid
      for (auto& u : last_usage_) {
        const int local = u.rank - spec().node_rank * spec().nprocs;
        const int device = local >= 0 && static_cast<std::size_t>(local) < devices.size() ? devices[static_cast<std::size_t>(local)] : -1;
        add_gpu_usage(u, members[pid_of[u.rank]], device, *gpus);
      }
    }
  }
  std::string lines;
  for (const auto& u : last_usage_) lines += usage_json_line(u);
  const std::string dir = o_.context.run_dir + "/metrics";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
  append_file(dir + "/ranks.jsonl", lines);
}

void RunWatches::say_usage() {
  const std::string text = usage_text(last_usage_);
  if (!text.empty()) o_.say(text);
}

// CPU time of each rank's process group (the rank leads its own): what it started counts,
// DataLoader workers and all.
std::map<int, std::uint64_t> RunWatches::group_cpu() const {
  std::map<int, std::uint64_t> by_pgid;
  for (const auto& p : list_processes()) by_pgid[p.pgid] += p.cpu;
  return by_pgid;
}

void RunWatches::sample_for_hangs() {
  if (!host_.running() || !hang_watch_) return;
  // CPU time first: a rank busy outside torch.distributed made progress, and is not asked
  // for its stack; the others are.
  auto cpu = std::make_shared<std::map<int, std::uint64_t>>();  // by rank
  const auto by_group = group_cpu();
  std::vector<int> ask;
  for (const auto& r : host_.ranks()) {
    if (!r.alive) continue;
    auto it = by_group.find(r.pid);
    const std::uint64_t used = it == by_group.end() ? 0 : it->second;
    (*cpu)[r.rank] = used;
    if (hang_watch_->wants_stack(r.rank, used, now_seconds())) ask.push_back(r.rank);
  }
  // The other nodes' ranks are always asked: their answers bring their CPU time along.
  const int world = spec().nnodes * spec().nprocs;
  for (int rank = 0; rank < world; ++rank)
    if (rank / spec().nprocs != spec().node_rank) ask.push_back(rank);
  stacks_->collect([this, cpu](const StacksSnapshot& snap) {
    host_.guarded("the hang watch", [&] {
      if (!host_.running() || !hang_watch_) return;
      std::vector<HangSample> samples;
      for (const auto& r : snap.ranks) {
        const auto it = cpu->find(r.rank);
        const std::uint64_t used = it != cpu->end() ? it->second : r.cpu_ticks > 0 ? static_cast<std::uint64_t>(r.cpu_ticks) : 0;
        HangSample s = r.status == "not asked" ? hang_watch_->carried(r.rank, used) : hang_sample(r);
        s.cpu = used;
        samples.push_back(std::move(s));
      }
      const double now = now_seconds();
      if (hang_watch_->feed(now, samples)) report_hang(hang_watch_->still_for(now));
    });
  }, false, &ask);
}

// No rank has made progress for hang_timeout: one report (the stacks kept in the run
// directory), then the run goes on, or ends as its timeout ends it (--on-hang stop).
void RunWatches::report_hang(double still) {
  stacks_->collect([this, still](const StacksSnapshot& snap) {
    host_.guarded("the hang report", [&] {
      if (!host_.running()) return;
      const std::string headline = hang_headline(snap, still, spec().hang_timeout);
      host_.hang_seen(headline, spec().stop_on_hang);
      say_stacks(snap, "run " + o_.context.run_id + ": " + headline +
                           (snap.file.empty() ? "" : "; every rank's stacks: " + snap.file));
      say_usage();
      if (spec().stop_on_hang) {
        ask_flight_recorder(host_.stop_timed_out, true);
      } else {
        ask_flight_recorder({}, false);
        o_.say("the run goes on (--on-hang report); airhost stacks " + o_.context.run_id +
                    " shows where the ranks are now");
      }
    });
  });
}

// GPU ranks stuck: their NCCL flight recorders are asked for a dump of their recent
// collectives (flight_recorder.hpp), read back into the summary when the run ends. `wait`:
// `then` runs once every asked rank dumped, or kFlightRecorderWaitMs passed (the ranks are
// about to be stopped, and would take their rings with them); else at once.
void RunWatches::ask_flight_recorder(std::function<void()> then, bool wait) {
  const std::string dir = o_.context.run_dir + "/stacks";
  const double since = now_seconds();
  auto asked = poke_flight_recorder(dir, kFlightRecorderPrefix);
  if (!asked.empty())
    o_.say("asked torch's flight recorder of " + std::string(asked.size() == 1 ? "rank " : "ranks ") +
                rank_ranges(asked) + " for its recent collectives (NCCL): " + dir + "/" + kFlightRecorderPrefix + "N");
  if (asked.empty() || !wait || closed_) {
    if (then) then();
    return;
  }
  fr_wait_ = {std::move(asked), since, uv_now(o_.loop) + kFlightRecorderWaitMs, std::move(then)};
  uv_timer_start(&fr_timer_, [](uv_timer_t* t) {
    auto* self = static_cast<RunWatches*>(t->data);
    self->host_.guarded("waiting for the flight recorder's dumps", [&] {
      auto& w = self->fr_wait_;
      const auto done = flight_recorder_dumped(self->o_.context.run_dir + "/stacks", kFlightRecorderPrefix, w.asked, w.since);
      if (done.size() < w.asked.size() && uv_now(self->o_.loop) < w.deadline) return;
      uv_timer_stop(t);
      if (done.size() < w.asked.size())
        self->o_.say("the flight recorder of " + std::to_string(w.asked.size() - done.size()) + " rank(s) did not dump within " +
                          std::to_string(kFlightRecorderWaitMs / 1000) + " s");
      auto then = std::move(w.then);
      w = {};
      if (then) then();
    });
  }, 100, 100);
}

void RunWatches::answer_stacks_ask(unsigned seq, const std::string& only_text) {
  if (!has_stacks() || !o_.answer_stacks) return;
  std::vector<int> only;
  for (const auto& rank : split(only_text, ',')) only.push_back(std::atoi(rank.c_str()));
  stacks_->collect([this, seq](const StacksSnapshot& snap) {
    host_.guarded("answering node 0's request for stacks", [&] {
      std::vector<RankStacks> ranks = snap.ranks;
      const auto by_group = group_cpu();
      for (auto& r : ranks)
        if (auto it = by_group.find(r.pid); r.pid > 0 && it != by_group.end()) r.cpu_ticks = static_cast<long long>(it->second);
      o_.answer_stacks(seq, ranks);
    });
  }, false, only_text.empty() ? nullptr : &only);
}

void RunWatches::take_answer(int node, unsigned seq, const std::string& ranks) {
  if (!stacks_) return;
  try {
    stacks_->take_answer(node, seq, decode_rank_stacks(ranks));
  } catch (const FrameError& e) {
    o_.log("node " + std::to_string(node) + "'s stacks could not be read: " + e.what());
  }
}

}  // namespace airhost::detail
