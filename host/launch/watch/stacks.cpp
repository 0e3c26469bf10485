#include "launch/watch/stacks.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <map>

#include "base/util.hpp"
#include "launch/rank/frames.hpp"

namespace airhost::detail {
namespace {

// Frames a summary shows of one stack; the file in the run directory has all of them.
constexpr std::size_t kSummaryFrames = 20;

std::string_view next_line(std::string_view& text) {
  const auto nl = text.find('\n');
  std::string_view line = text.substr(0, nl);
  text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
  return line;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// "key=value" among space-separated words.
std::string field(std::string_view line, std::string_view key) {
  std::string needle = " " + std::string(key) + "=";
  auto at = line.find(needle);
  if (at == std::string_view::npos) return "";
  line.remove_prefix(at + needle.size());
  return std::string(line.substr(0, line.find(' ')));
}

// `  File "NAME", line N in FUNCTION`: the name may itself hold quotes, so the last `", line `.
std::optional<StackFrame> parse_frame(std::string_view line) {
  constexpr std::string_view lead = "  File \"";
  if (!starts_with(line, lead)) return std::nullopt;
  line.remove_prefix(lead.size());
  const auto mid = line.rfind("\", line ");
  if (mid == std::string_view::npos) return std::nullopt;
  StackFrame f;
  f.file = std::string(line.substr(0, mid));
  std::string_view rest = line.substr(mid + 8);
  const auto in = rest.find(" in ");
  const std::string number(rest.substr(0, in));
  char* end = nullptr;
  const long n = std::strtol(number.c_str(), &end, 10);
  f.line = (end && *end == '\0' && !number.empty()) ? static_cast<int>(n) : -1;
  f.function = in == std::string_view::npos ? "???" : std::string(rest.substr(in + 4));
  return f;
}

std::string plural(std::size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string thread_name(const ThreadStack& t) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "0x%llx", t.id);
  return t.main ? std::string("main thread ") + buf : std::string("thread ") + buf;
}

// "node 0 pid 12" for one rank, "node 0 pids 12 13 14" for several on one node.
std::string pids_text(const std::vector<RankStacks>& ranks, const std::vector<std::size_t>& group) {
  std::map<int, std::vector<int>> by_node;
  for (auto i : group) by_node[ranks[i].node].push_back(ranks[i].pid);
  std::string s;
  for (const auto& [node, pids] : by_node) {
    if (!s.empty()) s += "; ";
    s += "node " + std::to_string(node) + (pids.size() == 1 ? ", pid" : ", pids");
    for (std::size_t k = 0; k < pids.size(); ++k) s += (k ? "," : " ") + std::to_string(pids[k]);
  }
  return s;
}

void frames_text(std::string& out, const ThreadStack& t, std::size_t limit, const char* indent) {
  std::size_t shown = 0;
  for (const auto& f : t.frames) {
    if (shown == limit) {
      out += indent + std::string("... ") + std::to_string(t.frames.size() - shown) + " more\n";
      return;
    }
    out += indent + frame_text(f) + "\n";
    ++shown;
  }
  if (t.frames.empty()) out += indent + std::string("(no Python frame)\n");
  if (t.truncated) out += indent + std::string("... (CPython stopped here: a deeper stack)\n");
}

std::string unanswered_text(const RankStacks& r) {
  if (r.status == "exited") return "has exited";
  std::string s = "gave " + (r.status.empty() ? std::string("no answer") : r.status);
  if (!r.proc_state.empty()) s += ": state " + r.proc_state;
  if (!r.wchan.empty() && r.wchan != "0") s += ", wchan " + r.wchan;
  return s;
}

std::string group_key(const RankStacks& r) {
  if (!r.answered) return "\x01" + r.status + "\x01" + r.proc_state + "\x01" + r.wchan;
  const ThreadStack* t = main_thread(r);
  if (!t) return "\x02" + r.error;
  std::string key;
  for (const auto& f : t->frames) key += f.file + "\x03" + std::to_string(f.line) + "\x03" + f.function + "\x04";
  return key;
}

// Whether the rank's main thread waits in torch.distributed (a collective, a barrier, the
// store): among groups of one size, those come after the others, which they wait for.
bool waits_in_collective(const RankStacks& r) {
  const ThreadStack* t = r.answered ? main_thread(r) : nullptr;
  if (!t) return false;
  for (const auto& f : t->frames)
    if (f.file.find("/torch/distributed/") != std::string::npos) return true;
  return false;
}

}  // namespace

std::optional<RankStacks> parse_dump(std::string_view text, unsigned seq) {
  const std::string seq_text = std::to_string(seq);
  const auto head = text.find(kStacksHeader);
  if (head == std::string_view::npos) return std::nullopt;
  text.remove_prefix(head);
  const std::string_view header = next_line(text);
  if (field(header, "seq") != seq_text) return std::nullopt;
  const std::string end_line = std::string(kStacksEnd) + "seq=" + seq_text;
  const auto end = text.find(end_line);
  if (end == std::string_view::npos) return std::nullopt;
  std::string_view body = text.substr(0, end);

  RankStacks r;
  r.answered = true;
  r.pid = std::atoi(field(header, "pid").c_str());
  const unsigned long long main_id = std::strtoull(field(header, "main").c_str(), nullptr, 10);
  while (!body.empty()) {
    const std::string_view line = next_line(body);
    if (starts_with(line, "Thread 0x") || starts_with(line, "Current thread 0x")) {
      ThreadStack t;
      t.current = starts_with(line, "Current");
      t.id = std::strtoull(std::string(line.substr(line.find("0x"))).c_str(), nullptr, 16);
      t.main = main_id != 0 && t.id == main_id;
      r.threads.push_back(std::move(t));
    } else if (auto f = parse_frame(line)) {
      if (!r.threads.empty()) r.threads.back().frames.push_back(std::move(*f));
    } else if (line == "  ..." || line == "...") {
      if (!r.threads.empty()) r.threads.back().truncated = true;
    } else if (starts_with(line, "error: ")) {
      r.error = std::string(line.substr(7));
    }
  }
  // The main thread first: CPython lists the newest thread first, so the main one comes last.
  std::stable_partition(r.threads.begin(), r.threads.end(), [](const ThreadStack& t) { return t.main; });
  return r;
}

namespace {

std::string encode_stack(const ThreadStack& t, std::size_t max_frames) {
  Fields f{{"id", std::to_string(t.id)},
           {"main", t.main ? "1" : "0"},
           {"current", t.current ? "1" : "0"},
           {"truncated", t.truncated || t.frames.size() > max_frames ? "1" : "0"}};
  for (std::size_t i = 0; i < t.frames.size() && i < max_frames; ++i)
    f["f" + std::to_string(i)] = encode_fields({{"file", t.frames[i].file},
                                                {"line", std::to_string(t.frames[i].line)},
                                                {"function", t.frames[i].function}});
  return encode_fields(f);
}

std::string encode_ranks(const std::vector<RankStacks>& ranks, std::size_t max_frames, bool idle_frames) {
  Fields all;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankStacks& r = ranks[i];
    Fields f{{"rank", std::to_string(r.rank)},       {"local_rank", std::to_string(r.local_rank)},
             {"node", std::to_string(r.node)},       {"pid", std::to_string(r.pid)},
             {"answered", r.answered ? "1" : "0"},  {"status", r.status},
             {"proc_state", r.proc_state},           {"wchan", r.wchan},
             {"error", r.error},                     {"cpu_ticks", std::to_string(r.cpu_ticks)}};
    for (std::size_t k = 0; k < r.threads.size(); ++k) {
      const bool keep = idle_frames || !is_idle(r.threads[k]);
      f["t" + std::to_string(k)] = encode_stack(r.threads[k], keep ? max_frames : 0);
    }
    all["r" + std::to_string(i)] = encode_fields(f);
  }
  return encode_fields(all);
}

long long to_ll(const std::string& s) { return s.empty() ? 0 : std::strtoll(s.c_str(), nullptr, 10); }

}  // namespace

std::string encode_rank_stacks(const std::vector<RankStacks>& ranks, std::size_t cap) {
  constexpr std::size_t kLinkFrames = 20;
  std::string out = encode_ranks(ranks, SIZE_MAX, true);
  if (out.size() > cap) out = encode_ranks(ranks, SIZE_MAX, false);
  if (out.size() > cap) out = encode_ranks(ranks, kLinkFrames, false);
  if (out.size() > cap) out = encode_ranks(ranks, 1, false);
  return out;
}

std::vector<RankStacks> decode_rank_stacks(std::string_view payload) {
  std::vector<RankStacks> out;
  Fields all = decode_fields(payload);
  for (std::size_t i = 0; all.count("r" + std::to_string(i)); ++i) {
    Fields f = decode_fields(all["r" + std::to_string(i)]);
    RankStacks r;
    r.rank = static_cast<int>(to_ll(f["rank"]));
    r.local_rank = static_cast<int>(to_ll(f["local_rank"]));
    r.node = static_cast<int>(to_ll(f["node"]));
    r.pid = static_cast<int>(to_ll(f["pid"]));
    r.answered = f["answered"] == "1";
    r.status = f["status"];
    r.proc_state = f["proc_state"];
    r.wchan = f["wchan"];
    r.error = f["error"];
    r.cpu_ticks = f.count("cpu_ticks") ? to_ll(f["cpu_ticks"]) : -1;
    for (std::size_t k = 0; f.count("t" + std::to_string(k)); ++k) {
      Fields t = decode_fields(f["t" + std::to_string(k)]);
      ThreadStack ts;
      ts.id = std::strtoull(t["id"].c_str(), nullptr, 10);
      ts.main = t["main"] == "1";
      ts.current = t["current"] == "1";
      ts.truncated = t["truncated"] == "1";
      for (std::size_t j = 0; t.count("f" + std::to_string(j)); ++j) {
        Fields fr = decode_fields(t["f" + std::to_string(j)]);
        ts.frames.push_back({fr["file"], static_cast<int>(to_ll(fr["line"])), fr["function"]});
      }
      r.threads.push_back(std::move(ts));
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool is_idle(const ThreadStack& t) {
  if (t.main) return false;
  if (t.frames.empty()) return true;
  const std::string& file = t.frames.front().file;
  for (const char* idle : {"/threading.py", "/queue.py", "/selectors.py"}) {
    const std::string_view tail(idle);
    if (file.size() >= tail.size() && file.compare(file.size() - tail.size(), tail.size(), tail) == 0) return true;
  }
  return false;
}

std::string frame_text(const StackFrame& f) {
  return f.file + ":" + (f.line >= 0 ? std::to_string(f.line) : std::string("?")) + " in " + f.function;
}

std::string where_text(const ThreadStack& t) {
  return t.frames.empty() ? std::string("(no Python frame)") : frame_text(t.frames.front());
}

const ThreadStack* main_thread(const RankStacks& r) {
  for (const auto& t : r.threads)
    if (t.main) return &t;
  // No thread matched the id the rank gave (an interpreter that numbers threads its own way):
  // CPython lists the oldest thread, the main one, last.
  return r.threads.empty() ? nullptr : &r.threads.back();
}

std::string group_ranks_fields(const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return "\"ranks\": [" + list + "], \"ranges\": " + json_quoted(rank_ranges(ranks));
}

std::vector<std::vector<std::size_t>> group_ranks(const std::vector<RankStacks>& ranks) {
  return odd_ones_first(ranks, group_key, waits_in_collective);
}

std::string render_text(const StacksSnapshot& s, bool all_threads) {
  const auto groups = group_ranks(s.ranks);
  std::string out = "stacks of run " + s.run_id + ": " + plural(s.ranks.size(), "rank", "ranks") + " in " +
                    plural(groups.size(), "group", "groups") + (groups.size() > 1 ? ", the odd ones out first" : "") +
                    (s.file.empty() ? "" : "; every thread in " + s.file) + "\n";
  for (const auto& g : groups) {
    std::vector<int> numbers;
    for (auto i : g) numbers.push_back(s.ranks[i].rank);
    const RankStacks& first = s.ranks[g.front()];
    out += (g.size() == 1 ? "rank " : "ranks ") + rank_ranges(numbers) + " (" + pids_text(s.ranks, g) + ") ";
    const ThreadStack* main = main_thread(first);
    if (!first.answered) {
      out += unanswered_text(first) + "\n";
      continue;
    }
    if (!main) {
      out += "sent no stack" + (first.error.empty() ? std::string() : ": " + first.error) + "\n";
      continue;
    }
    out += std::string(g.size() == 1 ? "is" : "are") + " in " + where_text(*main) + "\n";
    frames_text(out, *main, kSummaryFrames, "    ");
    for (auto i : g) {
      for (const auto& t : s.ranks[i].threads) {
        if (&t == main_thread(s.ranks[i]) || (!all_threads && is_idle(t))) continue;
        out += "  rank " + std::to_string(s.ranks[i].rank) + ", " + thread_name(t) + (is_idle(t) ? " (idle)" : "") +
               ": " + where_text(t) + "\n";
        if (all_threads) frames_text(out, t, kSummaryFrames, "      ");
      }
    }
  }
  return out;
}

std::string render_json(const StacksSnapshot& s) {
  std::string out = "{\"run_id\": " + json_quoted(s.run_id) + ", \"taken_at\": " + std::to_string(s.taken_at) +
                    ", \"file\": " + (s.file.empty() ? std::string("null") : json_quoted(s.file)) + ",\n \"groups\": [";
  const auto groups = group_ranks(s.ranks);
  for (std::size_t k = 0; k < groups.size(); ++k) {
    std::vector<int> numbers;
    for (auto i : groups[k]) numbers.push_back(s.ranks[i].rank);
    const RankStacks& first = s.ranks[groups[k].front()];
    const ThreadStack* main = main_thread(first);
    const std::string where = !first.answered ? unanswered_text(first) : main ? where_text(*main) : "no stack";
    out += std::string(k ? ",\n  " : "\n  ") + "{" + group_ranks_fields(numbers) +
           ", \"answered\": " + (first.answered ? "true" : "false") + ", \"where\": " + json_quoted(where) + "}";
  }
  out += "],\n \"ranks\": [";
  for (std::size_t k = 0; k < s.ranks.size(); ++k) {
    const RankStacks& r = s.ranks[k];
    const ThreadStack* main = main_thread(r);
    out += std::string(k ? ",\n  " : "\n  ") + "{\"rank\": " + std::to_string(r.rank) +
           ", \"local_rank\": " + std::to_string(r.local_rank) + ", \"node\": " + std::to_string(r.node) +
           ", \"pid\": " + std::to_string(r.pid) + ", \"answered\": " + (r.answered ? "true" : "false") +
           ", \"status\": " + json_quoted(r.answered ? "answered" : r.status) + ", \"proc_state\": " + json_quoted(r.proc_state) +
           ", \"wchan\": " + json_quoted(r.wchan) + ", \"error\": " + json_quoted(r.error) +
           ", \"where\": " + json_quoted(r.answered && main ? where_text(*main) : "") + ", \"threads\": [";
    for (std::size_t t = 0; t < r.threads.size(); ++t) {
      const ThreadStack& th = r.threads[t];
      char id[40];
      std::snprintf(id, sizeof id, "0x%llx", th.id);
      out += std::string(t ? ", " : "") + "{\"id\": " + json_quoted(id) + ", \"main\": " + (th.main ? "true" : "false") +
             ", \"idle\": " + (is_idle(th) ? "true" : "false") + ", \"truncated\": " + (th.truncated ? "true" : "false") +
             ", \"frames\": [";
      for (std::size_t f = 0; f < th.frames.size(); ++f)
        out += std::string(f ? ", " : "") + "{\"file\": " + json_quoted(th.frames[f].file) + ", \"line\": " +
               std::to_string(th.frames[f].line) + ", \"function\": " + json_quoted(th.frames[f].function) + "}";
      out += "]}";
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

std::string render_full(const StacksSnapshot& s) {
  std::string out = render_text(s, false) + "\n";
  for (const auto& r : s.ranks) {
    out += "==== rank " + std::to_string(r.rank) + " (node " + std::to_string(r.node) + ", local rank " +
           std::to_string(r.local_rank) + ", pid " + std::to_string(r.pid) + ")";
    if (!r.answered) {
      out += " " + unanswered_text(r) + "\n\n";
      continue;
    }
    out += "\n";
    if (!r.error.empty()) out += "  (CPython: " + r.error + ")\n";
    for (const auto& t : r.threads) {
      out += "  " + thread_name(t) + (t.current ? ", the one that dumped" : "") + (is_idle(t) ? " (idle)" : "") + ":\n";
      frames_text(out, t, static_cast<std::size_t>(-1), "    ");
    }
    out += "\n";
  }
  return out;
}

}  // namespace airhost::detail
