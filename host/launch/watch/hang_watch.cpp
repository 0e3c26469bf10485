// hang_watch.cpp — see hang_watch.hpp.
#include "launch/watch/hang_watch.hpp"

#include <algorithm>

#include "base/util.hpp"

namespace airhost::detail {
namespace {

bool in_torch_distributed(const StackFrame& f) { return f.file.find("/torch/distributed/") != std::string::npos; }

// The torch.distributed call a thread waits in: the innermost frame of torch/distributed that
// is not a decorator's wrapper ("all_reduce", "barrier"); empty when it waits in none.
std::string collective_of(const ThreadStack& t) {
  std::string fallback;
  for (const auto& f : t.frames) {
    if (!in_torch_distributed(f)) continue;
    if (f.function != "wrapper" && f.function != "_fn" && f.function.rfind('<', 0) != 0) return f.function;
    if (fallback.empty()) fallback = f.function;
  }
  return fallback;
}

// Where a rank's own code stands: the innermost frame outside torch.distributed.
std::string own_frame(const ThreadStack& t) {
  for (const auto& f : t.frames)
    if (!in_torch_distributed(f)) return frame_text(f);
  return where_text(t);
}

}  // namespace

std::chrono::milliseconds hang_sample_every(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 6, std::chrono::milliseconds(1000), std::chrono::milliseconds(60000));
}

HangSample hang_sample(const RankStacks& r) {
  HangSample s;
  s.rank = r.rank;
  s.alive = r.status != "exited";
  const ThreadStack* t = r.answered ? main_thread(r) : nullptr;
  if (!t) return s;
  for (const auto& f : t->frames) s.where += frame_text(f) + "\n";
  s.in_collective = !collective_of(*t).empty();
  return s;
}

bool HangWatch::busy(std::uint64_t before, std::uint64_t after, double seconds) const {
  if (after <= before) return false;
  const double share = kBusyShare * std::max(0.0, seconds) * static_cast<double>(hz_);
  return after - before >= std::max<std::uint64_t>(kBusyMinTicks, static_cast<std::uint64_t>(share));
}

bool HangWatch::wants_stack(int rank, std::uint64_t cpu, double now) const {
  // A rank not seen yet counts from 0: one that used CPU since it started (importing torch,
  // joining the group) is not interrupted for a stack it does not need.
  auto it = last_.find(rank);
  if (it == last_.end()) return cpu == 0;
  return it->second.in_collective || !busy(it->second.cpu, cpu, now - last_sample_);
}

HangSample HangWatch::carried(int rank, std::uint64_t cpu) const {
  HangSample s;
  if (auto it = last_.find(rank); it != last_.end()) s = it->second;
  s.rank = rank;
  s.cpu = cpu;
  return s;
}

bool HangWatch::feed(double now, const std::vector<HangSample>& ranks) {
  bool progress = !started_;
  const double since = now - last_sample_;
  last_sample_ = now;
  for (const auto& r : ranks) {
    if (!r.alive) continue;
    auto it = last_.find(r.rank);
    if (it == last_.end()) {
      progress = true;  // a rank seen for the first time (just started)
      continue;
    }
    const HangSample& before = it->second;
    if (r.where != before.where) progress = true;
    else if (busy(before.cpu, r.cpu, since) && !(r.in_collective && !r.where.empty())) progress = true;
  }
  last_.clear();
  for (const auto& r : ranks)
    if (r.alive) last_[r.rank] = r;
  if (!started_ || progress) {
    started_ = true;
    last_progress_ = now;
    reported_ = false;
    return false;
  }
  if (reported_ || last_.empty() || now - last_progress_ < static_cast<double>(timeout_.count()) / 1000.0) return false;
  reported_ = true;
  return true;
}

std::string hang_headline(const StacksSnapshot& snap, double still_seconds, std::chrono::milliseconds timeout) {
  std::string out = "no rank has made progress for " +
                    duration_text(std::chrono::milliseconds(static_cast<long long>(still_seconds) * 1000)) +
                    " (hang_timeout " + duration_text(timeout) + ")";
  // Ranks waiting in torch.distributed, by the call they wait in; the others, by where they are.
  std::map<std::string, std::vector<int>> waiting, elsewhere;
  std::vector<int> silent;
  for (const auto& r : snap.ranks) {
    if (r.status == "exited") continue;
    const ThreadStack* t = r.answered ? main_thread(r) : nullptr;
    if (!t) {
      silent.push_back(r.rank);
      continue;
    }
    const std::string call = collective_of(*t);
    if (!call.empty()) waiting[call].push_back(r.rank);
    else elsewhere[own_frame(*t)].push_back(r.rank);
  }
  auto ranks_word = [](const std::vector<int>& v) { return std::string(v.size() > 1 ? "ranks " : "rank ") + rank_ranges(v); };
  std::vector<std::string> parts;
  for (const auto& [where, rs] : elsewhere)
    parts.push_back(ranks_word(rs) + (rs.size() > 1 ? " are" : " is") + (waiting.empty() ? " at " : " elsewhere, at ") + where);
  if (!silent.empty()) parts.push_back(ranks_word(silent) + " did not answer (see /proc state below)");
  // "rank 0 waits in all_reduce", "ranks 0,2-7 wait in all_reduce and rank 1 in barrier"
  std::string waits;
  for (const auto& [call, rs] : waiting)
    waits += waits.empty() ? ranks_word(rs) + (rs.size() > 1 ? " wait in " : " waits in ") + call
                           : " and " + ranks_word(rs) + " in " + call;
  if (!waits.empty()) {
    if (parts.empty())
      parts.push_back(std::string(waiting.size() > 1 ? "every rank waits in torch.distributed, not all in the same call: "
                                                     : "every rank waits in torch.distributed: ") + waits);
    else
      parts.back() += ", while " + waits;
  }
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? ": " : "; ") + parts[i];
  return out;
}

}  // namespace airhost::detail
