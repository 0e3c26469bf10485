#include "launch/procs/escapees.hpp"

#include <cstdint>
#include <cstdio>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.hpp"
#include "base/uv_handle.hpp"
#include "launch/procs/group_guard.hpp"

namespace airhost::detail {

namespace {

// No exception may unwind through uv_run. A sweep or a reap that fails (out of memory while
// reading /proc, say) is said once and tried again at the next tick: the ranks themselves are
// still watched by the supervisor, and the guard ends them should the host die.
template <typename F>
void guarded(const char* what, F&& body) noexcept {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airhost: %s failed: %s\n", what, e.what());
  } catch (...) {
    std::fprintf(stderr, "airhost: %s failed\n", what);
  }
}

}  // namespace
namespace {

// How often the loop looks for processes of the run that left their rank's process group,
// to tell the guard about them (and reaps what it adopted, should a SIGCHLD have been missed).
constexpr uint64_t kSweepMs = 1000;

// After the run: how long the host waits for the processes it killed and adopted to die, so
// that it can reap them before it returns.
constexpr double kReapSeconds = 2.0;

}  // namespace

void Escapees::start(uv_loop_t* loop, GroupGuard* guard, std::string run_id, bool reap, RankPids rank_pids) {
  loop_ = loop;
  guard_ = guard;
  run_id_ = std::move(run_id);
  rank_pids_ = std::move(rank_pids);
  reaping_ = reap;
  own_sid_ = static_cast<int>(::getsid(0));
  started_ = true;
  uv_timer_init(loop_, &sweep_timer_);
  sweep_timer_.data = this;
  if (reaping_) {
    // A child subreaper (as a container's PID 1 is anyway): what a rank starts and leaves
    // behind (a daemon whose parent exited) becomes this process's child instead of init's,
    // stays in reach of the teardown, and is reaped here, not left a zombie.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    uv_signal_init(loop_, &sigchld_);
    sigchld_.data = this;
    uv_signal_start(&sigchld_, [](uv_signal_t* s, int) {
      guarded("reaping adopted orphans", [s] { static_cast<Escapees*>(s->data)->reap_adopted(); });
    }, SIGCHLD);
    reap_adopted();  // what arrived before this run (a restart's previous attempt)
  }
  uv_timer_start(&sweep_timer_, [](uv_timer_t* t) {
    guarded("sweeping /proc for escaped processes", [t] { static_cast<Escapees*>(t->data)->sweep(); });
  }, kSweepMs, kSweepMs);
}

// Pids of the processes libuv spawned on this loop (ranks, the guard): libuv reaps those.
std::set<int> Escapees::libuv_children() {
  std::set<int> pids;
  uv_walk(loop_, [](uv_handle_t* h, void* arg) {
    if (h->type == UV_PROCESS) static_cast<std::set<int>*>(arg)->insert(reinterpret_cast<uv_process_t*>(h)->pid);
  }, &pids);
  return pids;
}

// Children of this process that it adopted as subreaper: not libuv's, and not of its own
// session (its own helpers, the MLflow one, are waited for by their owners and never leave
// the session; every rank starts a session of its own).
std::vector<ProcStat> Escapees::adopted(const std::vector<ProcStat>& all, const std::set<int>& libuv) const {
  std::vector<ProcStat> out;
  const int self = static_cast<int>(::getpid());
  for (const auto& p : all)
    if (p.ppid == self && p.sid != own_sid_ && !libuv.count(p.pid)) out.push_back(p);
  return out;
}

// The run's processes, for proc_tree.hpp; `with_env`: with the environment scan (it reads
// every process's environ: for the teardown and the end, not for the periodic sweep).
RunMatch Escapees::match(bool with_env, const std::vector<ProcStat>& all) {
  RunMatch m;
  m.roots = rank_pids_();
  if (reaping_)
    for (const auto& p : adopted(all, libuv_children())) m.roots.insert(p.pid);
  m.known = reported_;
  if (with_env) m.env_entry = "AIRHOST_RUN_ID=" + run_id_;
  m.exclude.insert(static_cast<int>(::getpid()));
  if (guard_->pid() > 0) m.exclude.insert(guard_->pid());
  return m;
}

void Escapees::signal(int sig) {
  const auto groups = rank_pids_();
  const auto all = list_processes();
  for (const auto& p : match_run(all, match(true, all)))
    if (!groups.count(p.pgid)) ::kill(p.pid, sig);
}

void Escapees::kill_all() { kill_run(match(true, list_processes())); }

// What the periodic look needs, and no more: this process's tree (its ranks, what they started,
// the orphans it adopted) and the escapees it told the guard of (reparented elsewhere when it
// does not reap), read from /proc's child lists instead of every process of the machine.
std::vector<ProcStat> Escapees::own_tree() const {
  std::set<int> seeds{static_cast<int>(::getpid())};
  for (const auto& [pid, start] : reported_) seeds.insert(pid);
  return list_tree(seeds);
}

// Never waits for a pid of libuv's (its SIGCHLD handler does) nor for any other child:
// waitpid on each adopted pid, one by one.
void Escapees::reap_adopted() {
  if (!reaping_) return;
  siginfo_t info{};
  // Cheap first look: is any child a zombie at all?
  if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0) return;
  for (const auto& p : adopted(own_tree(), libuv_children()))
    if (p.state == 'Z') ::waitpid(p.pid, nullptr, WNOHANG);
}

// Tells the guard which processes left the ranks' groups (so that it can end them should this
// host be SIGKILLed, even if they cleared their environment), and reaps what a missed SIGCHLD
// left.
void Escapees::sweep() {
  reap_adopted();
  if (guard_->pid() <= 0) return;
  const auto groups = rank_pids_();
  std::map<int, std::uint64_t> now;
  const auto all = own_tree();
  for (const auto& p : match_run(all, match(false, all)))
    if (!groups.count(p.pgid)) now[p.pid] = p.start;
  for (const auto& [pid, start] : now)
    if (auto it = reported_.find(pid); it == reported_.end() || it->second != start) guard_->add_process(pid, start);
  for (const auto& [pid, start] : reported_)
    if (!now.count(pid)) guard_->remove_process(pid);
  reported_ = std::move(now);
}

void Escapees::close() {
  if (!started_) return;
  uv_close(as_handle(&sweep_timer_), nullptr);
  if (reaping_) uv_close(as_handle(&sigchld_), nullptr);
}

void Escapees::reap_after_run() {
  if (!reaping_) return;
  kill_all();  // adopted since the last look (nothing, as a rule)
  const double deadline = now_seconds() + kReapSeconds;
  for (;;) {
    bool alive = false;
    for (const auto& p : adopted(list_processes(), {})) {
      if (p.state == 'Z') ::waitpid(p.pid, nullptr, WNOHANG);
      else alive = true;
    }
    if (!alive || now_seconds() > deadline) return;
    ::usleep(10000);
  }
}

}  // namespace airhost::detail
