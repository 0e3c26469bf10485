#include "launch/watch/rank_usage.hpp"

#include <algorithm>
#include <cstdio>

#include "launch/watch/stacks.hpp"  // rank_ranges

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

void add_gpu_usage(RankUsage& u, const std::vector<int>& group_pids, int device, const GpuUsage& gpus) {
  std::map<unsigned, std::uint64_t> held;  // device → bytes of this rank's processes
  for (const auto& p : gpus.processes)
    if (std::find(group_pids.begin(), group_pids.end(), p.pid) != group_pids.end()) held[p.device] += p.memory;
  const GpuUsage::Device* dev = nullptr;
  auto find = [&](unsigned index) -> const GpuUsage::Device* {
    for (const auto& d : gpus.devices)
      if (d.index == index) return &d;
    return nullptr;
  };
  if (!held.empty()) {
    const auto most = std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    dev = find(most->first);
    u.gpu_memory = most->second;
  } else if (device >= 0 && (dev = find(static_cast<unsigned>(device)))) {
    u.gpu_memory = dev->memory_used;
  }
  if (!dev) return;
  u.gpu = static_cast<int>(dev->index);
  u.gpu_util_percent = dev->util_percent;
}

std::string usage_json_line(const RankUsage& u) {
  char buf[320];
  char cpu[32] = "null";
  if (u.cpu_percent >= 0) std::snprintf(cpu, sizeof cpu, "%.1f", u.cpu_percent);
  char gpu[160] = "";
  if (u.gpu >= 0) {
    char util[16] = "null";
    if (u.gpu_util_percent >= 0) std::snprintf(util, sizeof util, "%d", u.gpu_util_percent);
    std::snprintf(gpu, sizeof gpu, ", \"gpu\": %d, \"gpu_util_percent\": %s, \"gpu_memory_bytes\": %llu", u.gpu, util,
                  static_cast<unsigned long long>(u.gpu_memory));
  }
  std::snprintf(buf, sizeof buf, "{\"t\": %.3f, \"rank\": %d, \"node\": %d, \"cpu_percent\": %s, \"rss_bytes\": %llu%s}\n", u.t,
                u.rank, u.node, cpu, static_cast<unsigned long long>(u.rss), gpu);
  return buf;
}

std::string usage_text(const std::vector<RankUsage>& usage) {
  std::vector<RankUsage> known;
  for (const auto& u : usage)
    if (u.cpu_percent >= 0) known.push_back(u);
  if (known.empty()) return "";
  std::sort(known.begin(), known.end(), [](const RankUsage& a, const RankUsage& b) { return a.rank < b.rank; });
  const bool gpus = std::any_of(known.begin(), known.end(), [](const RankUsage& u) { return u.gpu >= 0; });
  std::string out = gpus ? "what each rank used (CPU of one core, memory resident; its GPU, GPU memory):"
                         : "what each rank used (CPU of one core, memory resident):";
  std::vector<int> idle, busy;
  for (const auto& u : known) {
    char cpu[16];
    std::snprintf(cpu, sizeof cpu, "%.0f%%", u.cpu_percent);
    out += std::string(&u == &known.front() ? " " : "; ") + "rank " + std::to_string(u.rank) + " " + cpu + " " +
           bytes_text(u.rss);
    const int util = u.gpu >= 0 ? u.gpu_util_percent : -1;
    if (u.gpu >= 0)
      out += ", GPU " + std::to_string(u.gpu) + " " + (util >= 0 ? std::to_string(util) + "%" : std::string("?%")) + " " +
             bytes_text(u.gpu_memory);
    if (u.cpu_percent < kIdlePercent && util < kIdlePercent) idle.push_back(u.rank);
    if (u.cpu_percent > kBusyPercent || util > kBusyPercent) busy.push_back(u.rank);
  }
  if (!idle.empty() && !busy.empty())
    out += std::string(". ") + (idle.size() == 1 ? "Rank " : "Ranks ") + rank_ranges(idle) + (idle.size() == 1 ? " is" : " are") +
           " idle while " + (busy.size() == 1 ? "rank " : "ranks ") + rank_ranges(busy) + (busy.size() == 1 ? " is" : " are") +
           " busy";
  return out;
}

}  // namespace airhost::detail
