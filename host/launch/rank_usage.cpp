#include "launch/rank_usage.hpp"

#include <algorithm>
#include <cstdio>

#include "launch/stacks.hpp"  // rank_ranges

namespace airhost::detail {
namespace {

constexpr double kIdlePercent = 5, kBusyPercent = 50;

std::string bytes_text(std::uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(b) / (1ull << 20));
  return buf;
}

}  // namespace

std::vector<RankUsage> UsageMeter::sample(double now, const std::vector<std::pair<int, int>>& rank_pids,
                                          const std::vector<ProcStat>& procs, int node) {
  std::map<int, std::pair<std::uint64_t, std::uint64_t>> by_group;  // pgid → (ticks, rss)
  for (const auto& p : procs) {
    auto& g = by_group[p.pgid];
    g.first += p.cpu;
    g.second += p.rss;
  }
  std::vector<RankUsage> out;
  for (const auto& [rank, pid] : rank_pids) {
    const auto it = by_group.find(pid);
    if (it == by_group.end()) continue;  // gone meanwhile
    RankUsage u;
    u.rank = rank;
    u.node = node;
    u.t = now;
    u.rss = it->second.second;
    const std::uint64_t ticks = it->second.first;
    if (const auto last = last_.find(rank); last != last_.end() && now > last->second.first && ticks >= last->second.second)
      u.cpu_percent = 100.0 * static_cast<double>(ticks - last->second.second) / static_cast<double>(hz_) /
                      (now - last->second.first);
    last_[rank] = {now, ticks};
    out.push_back(u);
  }
  return out;
}

std::string usage_json_line(const RankUsage& u) {
  char buf[200];
  char cpu[32] = "null";
  if (u.cpu_percent >= 0) std::snprintf(cpu, sizeof cpu, "%.1f", u.cpu_percent);
  std::snprintf(buf, sizeof buf, "{\"t\": %.3f, \"rank\": %d, \"node\": %d, \"cpu_percent\": %s, \"rss_bytes\": %llu}\n", u.t,
                u.rank, u.node, cpu, static_cast<unsigned long long>(u.rss));
  return buf;
}

std::string usage_text(const std::vector<RankUsage>& usage) {
  std::vector<RankUsage> known;
  for (const auto& u : usage)
    if (u.cpu_percent >= 0) known.push_back(u);
  if (known.empty()) return "";
  std::sort(known.begin(), known.end(), [](const RankUsage& a, const RankUsage& b) { return a.rank < b.rank; });
  std::string out = "what each rank used (CPU of one core, memory resident):";
  std::vector<int> idle, busy;
  for (const auto& u : known) {
    char cpu[16];
    std::snprintf(cpu, sizeof cpu, "%.0f%%", u.cpu_percent);
    out += std::string(&u == &known.front() ? " " : "; ") + "rank " + std::to_string(u.rank) + " " + cpu + " " +
           bytes_text(u.rss);
    if (u.cpu_percent < kIdlePercent) idle.push_back(u.rank);
    if (u.cpu_percent > kBusyPercent) busy.push_back(u.rank);
  }
  if (!idle.empty() && !busy.empty())
    out += std::string(". ") + (idle.size() == 1 ? "Rank " : "Ranks ") + rank_ranges(idle) + (idle.size() == 1 ? " is" : " are") +
           " idle while " + (busy.size() == 1 ? "rank " : "ranks ") + rank_ranges(busy) + (busy.size() == 1 ? " is" : " are") +
           " busy";
  return out;
}

}  // namespace airhost::detail
