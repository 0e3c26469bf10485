// link_group.cpp — see link_group.hpp.
#include "launch/link/link_group.hpp"

namespace airhost::detail {

std::vector<int> GroupState::peers() const {
  if (!hub()) return {0};
  std::vector<int> out;
  for (int n = 1; n < nnodes_; ++n) out.push_back(n);
  return out;
}

const GroupState::Attempt* GroupState::find(int attempt) const {
  auto it = attempts_.find(attempt);
  return it == attempts_.end() ? nullptr : &it->second;
}

bool GroupState::report_down(int attempt, const NodeDown& report, int from) {
  Attempt& a = attempts_[attempt];
  if (from == report.node) a.said_down.insert(report.node);
  if (!report.cascade && !report.lost && !report.grow) a.own_cause.insert(report.node);
  if (!a.heard.insert(report.node).second) return false;
  if (!a.first) a.first = report;
  if (!report.cascade && !a.first_real) a.first_real = report;
  return true;
}

void GroupState::report_done(int attempt, int node) { attempts_[attempt].done.insert(node); }

void GroupState::end(int attempt) { attempts_[attempt].ended = true; }

void GroupState::connection_gone(int node) { gone_.insert(node); }

bool GroupState::followed_nodes_gone(int attempt) const {
  const Attempt* a = find(attempt);
  if (!a || a->own_cause.count(self_)) return true;
  for (int n : a->own_cause)
    if (hub() ? !gone(n) : !gone(0)) return false;
  return true;
}

void GroupState::report_stopped(int attempt, int node, bool want_restart, bool leave) {
  Attempt& a = attempts_[attempt];
  a.stopped.insert(node);
  if (leave && !want_restart) a.leaving.insert(node);
  else a.leaving.erase(node);
  if (want_restart) a.want_restart.insert(node);
  else a.want_restart.erase(node);  // a node that withdraws (interrupted while it waited)
}

void GroupState::came_back(int attempt, int node) {
  gone_.erase(node);
  report_stopped(attempt, node, true);  // a fresh airhost, with no rank running: it starts with the group
}

std::vector<int> GroupState::rejoin_wanted(int attempt) const {
  const Attempt* a = find(attempt);
  if (!hub() || !a || a->decision) return {};
  std::vector<int> lost;
  for (int n = 0; n < nnodes_; ++n) {
    const bool wants = a->want_restart.count(n) > 0;
    if (!gone(n)) {
      if (!wants) return {};
    } else if (a->stopped.count(n) && !wants) {
      return {};  // it stopped for good, then left
    } else {
      lost.push_back(n);
    }
  }
  return lost;
}

std::vector<int> GroupState::go_on_without(int attempt) const {
  const Attempt* a = find(attempt);
  if (!hub() || !a || a->decision) return {};
  std::vector<int> without;
  for (int n = 0; n < nnodes_; ++n) {
    if (a->leaving.count(n)) {
      without.push_back(n);
    } else if (!gone(n)) {
      if (!a->stopped.count(n) || !a->want_restart.count(n)) return {};
    } else if (a->stopped.count(n) && !a->want_restart.count(n)) {
      return {};  // it stopped for good, then left
    } else {
      without.push_back(n);
    }
  }
  return without;
}

std::optional<bool> GroupState::decision(int attempt) const {
  const Attempt* a = find(attempt);
  return a ? a->decision : std::nullopt;
}

void GroupState::decide(int attempt, bool restart) {
  Attempt& a = attempts_[attempt];
  if (!a.decision) a.decision = restart;
}

bool GroupState::should_decide(int attempt) const {
  const Attempt* a = find(attempt);
  if (!hub() || !a || a->decision || !a->stopped.count(self_)) return false;
  // A node that stopped for good ends the job at once; else every node still here must have
  // stopped (and said whether it wants a restart) before a lost one is waited for.
  for (int n = 1; n < nnodes_; ++n)
    if (a->stopped.count(n) && !a->want_restart.count(n) && !a->leaving.count(n)) return true;
  for (int n = 1; n < nnodes_; ++n)
    if (!gone(n) && !a->stopped.count(n)) return false;
  return true;
}

bool GroupState::restart_agreed(int attempt) const {
  const Attempt* a = find(attempt);
  if (!a) return false;
  for (int n = 0; n < nnodes_; ++n)
    if (gone(n) || !a->want_restart.count(n)) return false;
  return true;
}

bool GroupState::ended(int attempt) const {
  const Attempt* a = find(attempt);
  return a && a->ended;
}

bool GroupState::all_done(int attempt) const {
  const Attempt* a = find(attempt);
  if (!a) return false;
  for (int n = 0; n < nnodes_; ++n)
    if (!a->done.count(n)) return false;
  return true;
}

bool GroupState::close_expected(int attempt, int node) const {
  const Attempt* a = find(attempt);
  return a && (a->said_down.count(node) || a->done.count(node) || a->ended);
}

std::optional<NodeDown> GroupState::verdict(int attempt) const {
  const Attempt* a = find(attempt);
  if (!a) return std::nullopt;
  return a->first_real ? a->first_real : a->first;
}

bool GroupState::any_down(int attempt) const {
  const Attempt* a = find(attempt);
  return a && a->first.has_value();
}

bool GroupState::real_down(int attempt) const {
  const Attempt* a = find(attempt);
  return a && a->first_real.has_value();
}

bool GroupState::quiet(int attempt) const {
  const Attempt* a = find(attempt);
  for (int p : peers())
    if (!gone(p) && !(a && a->said_down.count(p))) return false;
  return true;
}

}  // namespace airhost::detail
