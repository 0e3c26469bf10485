#include "launch/watch/stacks_sample.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <tuple>

#include "base/util.hpp"

namespace airhost::detail {
namespace {

// Functions a rank's part of the text shows; the JSON and the file have every one.
constexpr std::size_t kShownFunctions = 5;

template <typename K>
K most_frequent(const std::map<K, std::size_t>& counts, K fallback) {
  std::size_t best = 0;
  for (const auto& [k, n] : counts)
    if (n > best) best = n, fallback = k;
  return fallback;
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string function_text(const SampledFunction& f) {
  return f.file + ":" + (f.line >= 0 ? std::to_string(f.line) : std::string("?")) + " in " + f.function;
}

// "load_batch (data.py:12)": short, for the first line.
std::string short_text(const SampledFunction& f) {
  return f.function + " (" + base_name(f.file) + ":" + (f.line >= 0 ? std::to_string(f.line) : std::string("?")) + ")";
}

const SampledFunction* top(const RankProfile& r) {
  if (r.answered == 0 || r.functions.empty() || r.functions.front().own == 0) return nullptr;
  return &r.functions.front();
}

std::string profile_key(const RankProfile& r) {
  if (r.answered == 0) return "\x01" + r.status;
  const SampledFunction* f = top(r);
  return f ? f->file + "\x03" + f->function : std::string("\x02");
}

bool waits_in_torch_distributed(const RankProfile& r) {
  const SampledFunction* f = top(r);
  return f && f->file.find("/torch/distributed/") != std::string::npos;
}

std::string cpu_text(double cpu) {
  if (cpu < 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%% CPU", cpu);
  return buf;
}

std::string never_answered(const RankProfile& r) {
  return r.status.empty() ? std::string("gave no answer") : r.status == "exited" ? "had exited" : "gave " + r.status;
}

}  // namespace

void StacksSampler::add(const StacksSnapshot& snap) {
  ++rounds_;
  for (const RankStacks& r : snap.ranks) {
    PerRank& p = ranks_[r.rank];
    p.head.rank = r.rank;
    p.head.local_rank = r.local_rank;
    p.head.node = r.node;
    if (r.pid) p.head.pid = r.pid;
    if (r.status == "exited" || r.status == "not asked") {
      if (p.head.answered == 0) p.head.status = r.status;
      continue;
    }
    ++p.head.asked;
    const ThreadStack* main = r.answered ? main_thread(r) : nullptr;
    if (!main) {
      if (p.head.answered == 0) p.head.status = r.answered ? "no stack" : r.status;
      continue;
    }
    ++p.head.answered;
    std::set<std::pair<std::string, std::string>> seen;
    for (std::size_t i = 0; i < main->frames.size(); ++i) {
      const StackFrame& f = main->frames[i];
      Counts& c = p.functions[{f.file, f.function}];
      if (i == 0) {
        ++c.own;
        ++c.own_lines[f.line];
        if (main->frames.size() > 1) ++c.callers[frame_text(main->frames[1])];
      }
      ++c.lines[f.line];
      if (seen.insert({f.file, f.function}).second) ++c.total;
    }
  }
}

StacksSample StacksSampler::result() const {
  StacksSample s;
  s.rounds = rounds_;
  for (const auto& [rank, p] : ranks_) {
    RankProfile r = p.head;
    for (const auto& [key, c] : p.functions) {
      SampledFunction f;
      f.file = key.first;
      f.function = key.second;
      f.own = c.own;
      f.total = c.total;
      f.line = c.own ? most_frequent(c.own_lines, -1) : most_frequent(c.lines, -1);
      f.caller = most_frequent(c.callers, std::string());
      r.functions.push_back(std::move(f));
    }
    std::sort(r.functions.begin(), r.functions.end(), [](const SampledFunction& a, const SampledFunction& b) {
      if (a.own != b.own) return a.own > b.own;
      if (a.total != b.total) return a.total > b.total;
      return std::tie(a.file, a.function) < std::tie(b.file, b.function);
    });
    s.ranks.push_back(std::move(r));
  }
  return s;
}

std::vector<std::vector<std::size_t>> group_profiles(const std::vector<RankProfile>& ranks) {
  return odd_ones_first(ranks, profile_key, waits_in_torch_distributed);
}

std::string percent_text(std::size_t part, std::size_t whole) {
  if (whole == 0 || part == 0) return "0%";
  const double p = 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  if (p < 1) return "<1%";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", p);
  return buf;
}

std::string render_sample_text(const StacksSample& s) {
  const auto groups = group_profiles(s.ranks);
  char head[160];
  std::snprintf(head, sizeof head, "sampled run %s for %.1f s: %zu rounds, one every %ld ms", s.run_id.c_str(),
                s.seconds, s.rounds, s.interval_ms);
  std::string out = head;
  out += "; " + std::to_string(s.ranks.size()) + (s.ranks.size() == 1 ? " rank" : " ranks") + " in " +
         std::to_string(groups.size()) + (groups.size() == 1 ? " group" : " groups") +
         (groups.size() > 1 ? ", the odd ones out first" : "") + (s.file.empty() ? "" : "; saved in " + s.file) + "\n";

  // One line with every group: where the time goes, at a glance.
  std::string glance;
  for (const auto& g : groups) {
    std::vector<int> numbers;
    for (auto i : g) numbers.push_back(s.ranks[i].rank);
    const RankProfile& first = s.ranks[g.front()];
    glance += (glance.empty() ? "" : "; ") + std::string(g.size() == 1 ? "rank " : "ranks ") + rank_ranges(numbers) + ": ";
    const SampledFunction* f = top(first);
    if (!f) {
      glance += first.answered ? "no Python frame" : never_answered(first);
      continue;
    }
    // The group's share: the lowest and highest of its ranks.
    std::size_t lo = 100, hi = 0;
    for (auto i : g) {
      const RankProfile& r = s.ranks[i];
      const std::size_t p = r.answered ? 100 * r.functions.front().own / r.answered : 0;
      lo = std::min(lo, p), hi = std::max(hi, p);
    }
    glance += (lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi)) + "% in " + short_text(*f);
  }
  out += glance + "\n";

  for (const auto& g : groups) {
    for (auto i : g) {
      const RankProfile& r = s.ranks[i];
      std::string cpu = cpu_text(r.cpu_percent);
      out += "rank " + std::to_string(r.rank) + " (node " + std::to_string(r.node) + ", pid " + std::to_string(r.pid) +
             (cpu.empty() ? "" : ", " + cpu) + "): ";
      if (r.answered == 0) {
        out += never_answered(r) + "\n";
        continue;
      }
      out += std::to_string(r.answered) + " of " + std::to_string(r.asked) + " samples\n";
      out += "    own  total\n";
      std::size_t shown = 0;
      for (const auto& f : r.functions) {
        if (shown == kShownFunctions || (f.own == 0 && shown > 0)) break;
        char cols[32];
        std::snprintf(cols, sizeof cols, "  %5s  %5s  ", percent_text(f.own, r.answered).c_str(),
                      percent_text(f.total, r.answered).c_str());
        out += cols + function_text(f) + (f.caller.empty() ? "" : "  <- " + f.caller) + "\n";
        ++shown;
      }
    }
  }
  return out;
}

std::string render_sample_json(const StacksSample& s) {
  char head[200];
  std::snprintf(head, sizeof head, "{\"run_id\": %s, \"started_at\": %.3f, \"seconds\": %.3f, \"interval_ms\": %ld, \"rounds\": %zu, ",
                json_quoted(s.run_id).c_str(), s.started_at, s.seconds, s.interval_ms, s.rounds);
  std::string out = head;
  out += "\"file\": " + (s.file.empty() ? std::string("null") : json_quoted(s.file)) + ",\n \"groups\": [";
  const auto groups = group_profiles(s.ranks);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    std::vector<int> numbers;
    for (auto i : groups[k]) numbers.push_back(s.ranks[i].rank);
    const RankProfile& first = s.ranks[groups[k].front()];
    const SampledFunction* f = top(first);
    out += std::string(k ? ",\n  " : "\n  ") + "{" + group_ranks_fields(numbers) +
           ", \"where\": " + json_quoted(f ? function_text(*f) : first.answered ? "no Python frame" : never_answered(first)) +
           ", \"function\": " + (f ? json_quoted(f->function) : std::string("null")) + "}";
  }
  out += "],\n \"ranks\": [";
  for (std::size_t k = 0; k < s.ranks.size(); ++k) {
    const RankProfile& r = s.ranks[k];
    char cpu[32] = "null";
    if (r.cpu_percent >= 0) std::snprintf(cpu, sizeof cpu, "%.1f", r.cpu_percent);
    out += std::string(k ? ",\n  " : "\n  ") + "{\"rank\": " + std::to_string(r.rank) +
           ", \"local_rank\": " + std::to_string(r.local_rank) + ", \"node\": " + std::to_string(r.node) +
           ", \"pid\": " + std::to_string(r.pid) + ", \"asked\": " + std::to_string(r.asked) +
           ", \"answered\": " + std::to_string(r.answered) + ", \"status\": " + json_quoted(r.answered ? "answered" : r.status) +
           ", \"cpu_percent\": " + cpu + ", \"functions\": [";
    for (std::size_t i = 0; i < r.functions.size(); ++i) {
      const SampledFunction& f = r.functions[i];
      char shares[96];
      std::snprintf(shares, sizeof shares, ", \"own_share\": %.4f, \"total_share\": %.4f",
                    r.answered ? static_cast<double>(f.own) / static_cast<double>(r.answered) : 0.0,
                    r.answered ? static_cast<double>(f.total) / static_cast<double>(r.answered) : 0.0);
      out += std::string(i ? ", " : "") + "{\"file\": " + json_quoted(f.file) + ", \"line\": " + std::to_string(f.line) +
             ", \"function\": " + json_quoted(f.function) + ", \"own\": " + std::to_string(f.own) +
             ", \"total\": " + std::to_string(f.total) + shares + ", \"caller\": " + json_quoted(f.caller) + "}";
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

}  // namespace airhost::detail
