// config.cpp — the TOML layer of Settings. Strict on purpose: a misspelt key or a wrong
// type is an error with its line and column, never a silently ignored setting.
#include "cli/config.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

// Header-only with exceptions whatever the build passes (Debian's tomlplusplus CMake target
// would pass TOML_HEADER_ONLY=0): nothing of toml++ is then needed at run time, and parse
// errors arrive as toml::parse_error, which carries the position for the message.
#undef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#undef TOML_SHARED_LIB
#undef TOML_EXCEPTIONS
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include "base/util.hpp"
#include "cli/retention.hpp"

namespace airhost::detail {

void Settings::merge(const Settings& over) {
  auto take = [](auto& mine, const auto& theirs) {
    if (theirs) mine = theirs;
  };
  take(accelerators, over.accelerators);
  take(timeout, over.timeout);
  take(grace, over.grace);
  take(hang_timeout, over.hang_timeout);
  take(stop_on_hang, over.stop_on_hang);
  take(python, over.python);
  take(run_dir, over.run_dir);
  take(master_addr, over.master_addr);
  take(master_port, over.master_port);
  if (over.nnodes) nnodes_min = over.nnodes_min;  // "4" over "2:4" is a fixed count again
  take(nnodes, over.nnodes);
  take(join_settle, over.join_settle);
  take(scale_up_interval, over.scale_up_interval);
  take(node_rank, over.node_rank);
  take(max_restarts, over.max_restarts);
  take(node_timeout, over.node_timeout);
  take(join_timeout, over.join_timeout);
  take(join_token_file, over.join_token_file);
  take(preflight, over.preflight);
  take(tracking, over.tracking);
  take(experiment, over.experiment);
  take(retention, over.retention);
  take(log_max_bytes, over.log_max_bytes);
  take(preload, over.preload);
  take(warm, over.warm);
  take(prefix, over.prefix);
  take(ranks, over.ranks);
  for (const auto& [name, value] : over.env) env[name] = value;
  slurm.merge(over.slurm);
}

std::string checked_warning_signal(const std::string& text, const std::string& what) {
  if (text == "off") return "";
  const auto at = text.find('@');
  const std::string sig = text.substr(0, at);
  const std::string seconds = at == std::string::npos ? "" : text.substr(at + 1);
  const bool digits = !seconds.empty() && seconds.size() <= 5 && seconds.find_first_not_of("0123456789") == std::string::npos;
  if ((sig != "USR1" && sig != "USR2") || !digits || std::stoi(seconds) < 1)
    throw ConfigError(what + " takes USR1 or USR2, '@' and the seconds before the time limit, or off; got '" + text +
                      "'; e.g. USR1@90 (airhost passes SIGUSR1 and SIGUSR2 to every rank)");
  return text;
}

void SlurmSettings::merge(const SlurmSettings& over) {
  auto take = [](auto& mine, const auto& theirs) {
    if (theirs) mine = theirs;
  };
  take(partition, over.partition);
  take(account, over.account);
  take(qos, over.qos);
  take(time, over.time);
  take(gpus_per_node, over.gpus_per_node);
  take(cpus_per_task, over.cpus_per_task);
  take(mem, over.mem);
  take(constraint, over.constraint);
  take(signal, over.signal);
  take(requeue, over.requeue);
  extra.insert(extra.end(), over.extra.begin(), over.extra.end());
}

// ---------------------------------------------------------------------------------------
// Durations

namespace {

constexpr std::string_view kDurationForms = "a duration like 90 (seconds), 90s, 15m, 3h, 1h30m, 7d or 500ms";

// Parses a duration; on failure returns nullopt and says why in `problem`, phrased to
// follow the name of the setting ("must not be negative").
std::optional<std::chrono::milliseconds> try_parse_duration(std::string_view text,
                                                            std::string& problem) {
  auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);

  const std::string bad_form = "must be " + std::string(kDurationForms);
  if (text.empty()) {
    problem = bad_form;
    return std::nullopt;
  }
  if (text.front() == '-') {
    problem = "must not be negative";
    return std::nullopt;
  }

  struct Unit {
    std::string_view name;
    std::uint64_t ms;
  };
  // Largest first: a component's unit must come after every earlier one's in this list.
  static constexpr Unit kUnits[] = {
      {"d", 86'400'000}, {"h", 3'600'000}, {"m", 60'000}, {"s", 1'000}, {"ms", 1}};
  constexpr std::size_t kUnitCount = std::size(kUnits);

  std::uint64_t total = 0;
  std::size_t next_unit = 0;  // index of the largest unit still allowed
  std::size_t pos = 0;
  bool overflow = false;
  while (pos < text.size()) {
    std::uint64_t number = 0;
    const std::size_t digits_start = pos;
    for (; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos) {
      overflow |= __builtin_mul_overflow(number, 10u, &number);
      overflow |= __builtin_add_overflow(number, static_cast<unsigned>(text[pos] - '0'), &number);
    }
    const std::size_t unit_start = pos;
    for (; pos < text.size() && text[pos] >= 'a' && text[pos] <= 'z'; ++pos) {
    }
    const std::string_view unit = text.substr(unit_start, pos - unit_start);
    if (pos == digits_start || unit_start == digits_start) {
      problem = bad_form;  // junk, or a unit without a number
      return std::nullopt;
    }
    std::uint64_t scale = 0;
    if (unit.empty() && digits_start == 0 && pos == text.size()) {
      scale = 1'000;  // a bare number is seconds
      next_unit = kUnitCount;
    } else {
      std::size_t u = next_unit;
      while (u < kUnitCount && kUnits[u].name != unit) ++u;
      if (u == kUnitCount) {
        problem = bad_form;  // unknown unit, missing unit, or units out of order
        return std::nullopt;
      }
      scale = kUnits[u].ms;
      next_unit = u + 1;
    }
    std::uint64_t part = 0;
    overflow |= __builtin_mul_overflow(number, scale, &part);
    overflow |= __builtin_add_overflow(total, part, &total);
  }
  if (overflow || total > static_cast<std::uint64_t>(INT64_MAX)) {
    problem = "is too large";
    return std::nullopt;
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(total));
}


}  // namespace

std::optional<std::pair<int, int>> parse_node_count(std::string_view text) {
  auto number = [](std::string_view t) -> std::optional<int> {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    return std::stoi(std::string(t));
  };
  const auto colon = text.find(':');
  const auto lo = number(text.substr(0, colon));
  const auto hi = colon == std::string_view::npos ? lo : number(text.substr(colon + 1));
  if (!lo || !hi || *lo < 1 || *hi < *lo) return std::nullopt;
  return std::pair{*lo, *hi};
}

std::chrono::milliseconds parse_duration(std::string_view text, const std::string& what) {
  std::string problem;
  if (auto d = try_parse_duration(text, problem)) return *d;
  throw ConfigError(what + " " + problem + ", got " + single_quoted(text));
}

std::chrono::seconds parse_duration_seconds(std::string_view text, const std::string& what) {
  const auto ms = parse_duration(text, what);
  if (ms.count() % 1000 != 0)
    throw ConfigError(what + " must be a whole number of seconds, got " + single_quoted(text) +
                      "; round it, e.g. '2s' or '1m'");
  return std::chrono::duration_cast<std::chrono::seconds>(ms);
}

// ---------------------------------------------------------------------------------------
// "Did you mean"

std::optional<std::string> closest_name(std::string_view word,
                                        const std::vector<std::string>& candidates) {
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::optional<std::string> best;
  std::size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    const std::size_t d = distance(word, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  // Two edits catch most typos; for short words that would match nearly anything.
  const std::size_t limit = word.size() <= 4 ? 1 : 2;
  if (best_distance > limit) return std::nullopt;
  return best;
}

// ---------------------------------------------------------------------------------------
// TOML → Settings

namespace {

constexpr std::string_view kSeeDefaults = "see configs/default.toml for every key";

std::string type_phrase(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// How one key is expected to look, for messages: "key 'K' must be EXPECTED, got X; e.g. EXAMPLE".
struct KeyDoc {
  std::string_view name;
  std::string_view expected;
  std::string_view example;
};

constexpr KeyDoc kTopKeys[] = {
    {"accelerators", "a non-negative integer (0 = one rank per visible GPU)", "accelerators = 4"},
    {"timeout", "seconds or a duration string (0 = no timeout)", "timeout = \"3h\""},
    {"grace", "seconds or a duration string", "grace = \"10s\""},
    {"hang_timeout", "a duration of at least 1 second, or \"off\"", "hang_timeout = \"30m\""},
    {"on_hang", "\"report\" or \"stop\"", "on_hang = \"stop\""},
    {"python", "a string (an interpreter path, \"\" = the default)", "python = \"/usr/bin/python3\""},
    {"run_dir", "a string (a directory, \"\" = the default)", "run_dir = \"/scratch/runs/exp1\""},
    {"master_addr", "a non-empty string (a host name or IP address)", "master_addr = \"127.0.0.1\""},
    {"master_port", "an integer from 0 to 65535 (0 = a free port)", "master_port = 29500"},
    {"max_restarts", "an integer from 0 to 1000", "max_restarts = 3"},
    {"nnodes", "a positive integer (the number of nodes), or \"MIN:MAX\" for an elastic job", "nnodes = 2"},
    {"join_settle", "a duration: once MIN nodes of an elastic job joined, how long no newcomer must come", "join_settle = \"3s\""},
    {"scale_up_interval", "a duration: the least time between two restarts of an elastic job that take nodes in", "scale_up_interval = \"1m\""},
    {"node_rank", "a non-negative integer (this node's rank, below nnodes)", "node_rank = 0"},
    {"node_timeout", "a whole number of seconds, at least 1, or a duration string", "node_timeout = \"30s\""},
    {"join_timeout", "a whole number of seconds, at least 1, or a duration string", "join_timeout = \"10m\""},
    {"join_token_file", "a string (a file of mode 0600 holding the job's join token)",
     "join_token_file = \"/run/secrets/airhost-join-token\""},
    {"preflight", "a boolean", "preflight = true"},
    {"tracking", "a boolean", "tracking = false"},
    {"experiment", "a string (an MLflow experiment name)", "experiment = \"llama-sft\""},
    {"log_max_size", "a size such as \"100M\" (0: no bound)", "log_max_size = \"100M\""},
    {"retention", "\"off\", or older_than, keep and max_size (any of them)",
     "retention = \"older_than=30d,keep=1000,max_size=20G\""},
    {"preload", "an array of module names", "preload = [\"torch\", \"numpy\"]"},
    {"warm", "a boolean", "warm = false"},
    {"output", "a table", "a section [output] holding prefix = true"},
    {"env", "a table of strings", "a section [env] holding NAME = \"value\""},
    {"slurm", "a table", "a section [slurm] holding partition = \"gpu\""},
};
constexpr KeyDoc kSlurmKeys[] = {
    {"partition", "a non-empty string", "partition = \"gpu\""},
    {"account", "a non-empty string", "account = \"ml-team\""},
    {"qos", "a non-empty string", "qos = \"high\""},
    {"time", "a non-empty string in Slurm's --time form", "time = \"24:00:00\""},
    {"gpus_per_node", "a non-negative integer", "gpus_per_node = 8"},
    {"cpus_per_task", "a positive integer (the CPUs of the one airhost task per node)", "cpus_per_task = 64"},
    {"mem", "a non-empty string in Slurm's --mem form", "mem = \"256G\""},
    {"constraint", "a non-empty string", "constraint = \"h100\""},
    {"extra", "an array of sbatch options, one #SBATCH line each", "extra = [\"--exclusive\"]"},
    {"signal", "USR1 or USR2, '@' and seconds before the time limit, or \"off\"", "signal = \"USR1@90\""},
    {"requeue", "a boolean (requeue the job when it stops after the warning)", "requeue = true"},
};
constexpr KeyDoc kOutputKeys[] = {
    {"prefix", "a boolean", "prefix = false"},
    {"ranks", "an array of rank numbers (non-negative integers)", "ranks = [0, 1]"},
};

template <std::size_t N>
const KeyDoc* find_doc(const KeyDoc (&docs)[N], std::string_view name) {
  for (const auto& doc : docs)
    if (doc.name == name) return &doc;
  return nullptr;
}

template <std::size_t N>
std::vector<std::string> doc_names(const KeyDoc (&docs)[N]) {
  std::vector<std::string> names;
  for (const auto& doc : docs) names.emplace_back(doc.name);
  return names;
}

class ConfigReader {
 public:
  explicit ConfigReader(const std::string& origin) : origin_(origin) {}

  Settings read(const toml::table& root) {
    Settings settings;
    for (const auto& [key, node] : root) {
      const std::string name(key.str());
      const KeyDoc* doc = find_doc(kTopKeys, name);
      if (!doc) unknown_key(key, name, name, doc_names(kTopKeys));
      read_top(settings, *doc, node);
    }
    return settings;
  }

 private:
  [[noreturn]] void fail(const toml::source_region& where, const std::string& message) const {
    throw ConfigError(origin_ + ":" + std::to_string(where.begin.line) + ":" +
                      std::to_string(where.begin.column) + ": " + message);
  }

  [[noreturn]] void unknown_key(const toml::key& key, const std::string& shown,
                                const std::string& name,
                                const std::vector<std::string>& known) const {
    std::string hint;
    // torchrun's name for the rank count is the likeliest thing to be tried.
    if (name == "nproc_per_node" || name == "nproc-per-node")
      hint = " (did you mean 'accelerators'?)";
    else if (auto near = closest_name(name, known))
      hint = " (did you mean '" + *near + "'?)";
    fail(key.source(), "unknown key '" + shown + "'" + hint + "; " + std::string(kSeeDefaults));
  }

  [[noreturn]] void bad(const toml::node& node, const std::string& shown, const KeyDoc& doc,
                        const std::string& got) const {
    fail(node.source(), "key '" + shown + "' must be " + std::string(doc.expected) + ", got " +
                            got + "; e.g. " + std::string(doc.example));
  }

  [[noreturn]] void bad_type(const toml::node& node, const std::string& shown,
                             const KeyDoc& doc) const {
    bad(node, shown, doc, type_phrase(node));
  }

  std::int64_t integer(const toml::node& node, const std::string& shown, const KeyDoc& doc,
                       std::int64_t low, std::int64_t high) const {
    const auto* value = node.as_integer();
    if (!value) bad_type(node, shown, doc);
    const std::int64_t n = value->get();
    if (n < low || n > high) bad(node, shown, doc, std::to_string(n));
    return n;
  }

  bool boolean(const toml::node& node, const std::string& shown, const KeyDoc& doc) const {
    const auto* value = node.as_boolean();
    if (!value) bad_type(node, shown, doc);
    return value->get();
  }

  std::string string(const toml::node& node, const std::string& shown, const KeyDoc& doc) const {
    const auto* value = node.as_string();
    if (!value) bad_type(node, shown, doc);
    return value->get();
  }

  // An integer is seconds; a string is a duration ("3h").
  std::chrono::milliseconds duration(const toml::node& node, const std::string& shown,
                                     const KeyDoc& doc) const {
    if (const auto* seconds = node.as_integer()) {
      const std::int64_t n = seconds->get();
      if (n < 0) {
        fail(node.source(), "key '" + shown + "' must not be negative, got " + std::to_string(n) +
                                "; e.g. " + std::string(doc.example));
      }
      if (n > INT64_MAX / 1000) bad(node, shown, doc, std::to_string(n));
      return std::chrono::seconds(n);
    }
    const auto* text = node.as_string();
    if (!text) bad_type(node, shown, doc);
    std::string problem;
    const auto parsed = try_parse_duration(text->get(), problem);
    if (!parsed) {
      fail(node.source(), "key '" + shown + "' " + problem + ", got " + single_quoted(text->get()) +
                              "; e.g. " + std::string(doc.example));
    }
    return *parsed;
  }

  void read_top(Settings& s, const KeyDoc& doc, const toml::node& node) const {
    const std::string name(doc.name);
    if (name == "accelerators") {
      s.accelerators = static_cast<int>(integer(node, name, doc, 0, INT_MAX));
    } else if (name == "timeout") {
      const auto ms = duration(node, name, doc);
      if (ms.count() % 1000 != 0) {  // only a string ("1500ms") can get here
        fail(node.source(), "key 'timeout' must be a whole number of seconds, got " +
                                single_quoted(node.as_string()->get()) + "; e.g. " +
                                std::string(doc.example));
      }
      s.timeout = std::chrono::duration_cast<std::chrono::seconds>(ms);
    } else if (name == "grace") {
      s.grace = duration(node, name, doc);
    } else if (name == "hang_timeout") {
      if (const auto* text = node.as_string(); text && text->get() == "off") {
        s.hang_timeout = std::chrono::milliseconds(0);
      } else {
        const auto ms = duration(node, name, doc);
        if (ms.count() < 1000) bad(node, name, doc, node.as_string() ? single_quoted(node.as_string()->get()) : std::to_string(ms.count() / 1000));
        s.hang_timeout = ms;
      }
    } else if (name == "on_hang") {
      const std::string v = string(node, name, doc);
      if (v != "report" && v != "stop") bad(node, name, doc, single_quoted(v));
      s.stop_on_hang = v == "stop";
    } else if (name == "python") {
      s.python = string(node, name, doc);
    } else if (name == "join_token_file") {
      s.join_token_file = string(node, name, doc);
    } else if (name == "run_dir") {
      s.run_dir = string(node, name, doc);
    } else if (name == "master_addr") {
      s.master_addr = string(node, name, doc);
      if (s.master_addr->empty()) bad(node, name, doc, "an empty string");
    } else if (name == "master_port") {
      s.master_port = static_cast<int>(integer(node, name, doc, 0, 65535));
    } else if (name == "max_restarts") {
      s.max_restarts = static_cast<int>(integer(node, name, doc, 0, 1000));
    } else if (name == "nnodes") {
      if (node.as_string()) {
        const auto range = parse_node_count(node.as_string()->get());
        if (!range) bad(node, name, doc, single_quoted(node.as_string()->get()));
        s.nnodes = range->second;
        if (range->first != range->second) s.nnodes_min = range->first;
      } else {
        s.nnodes = static_cast<int>(integer(node, name, doc, 1, INT_MAX));
      }
    } else if (name == "join_settle") {
      s.join_settle = duration(node, name, doc);
    } else if (name == "scale_up_interval") {
      s.scale_up_interval = duration(node, name, doc);
    } else if (name == "node_rank") {
      s.node_rank = static_cast<int>(integer(node, name, doc, 0, INT_MAX));
    } else if (name == "node_timeout" || name == "join_timeout") {
      const auto ms = duration(node, name, doc);
      if (ms.count() % 1000 != 0 || ms.count() == 0) {
        const std::string got = node.as_string() ? single_quoted(node.as_string()->get()) : std::string("0");
        fail(node.source(), "key '" + name + "' must be a whole number of seconds, at least 1, got " + got +
                                "; e.g. " + std::string(doc.example));
      }
      (name == "node_timeout" ? s.node_timeout : s.join_timeout) = std::chrono::duration_cast<std::chrono::seconds>(ms);
    } else if (name == "preflight") {
      s.preflight = boolean(node, name, doc);
    } else if (name == "tracking") {
      s.tracking = boolean(node, name, doc);
    } else if (name == "log_max_size") {
      const auto* text = node.as_string();
      if (!text) bad_type(node, name, doc);
      try {
        s.log_max_bytes = parse_size(text->get(), "log_max_size");
      } catch (const ConfigError& e) {
        fail(node.source(), e.what());
      }
    } else if (name == "retention") {
      const auto* text = node.as_string();
      if (!text) bad_type(node, name, doc);
      try {
        parse_retention(text->get(), "retention");
      } catch (const ConfigError& e) {
        fail(node.source(), e.what());
      }
      s.retention = text->get();
    } else if (name == "experiment") {
      const auto* text = node.as_string();
      if (!text || text->get().empty()) bad_type(node, name, doc);
      s.experiment = text->get();
    } else if (name == "warm") {
      s.warm = boolean(node, name, doc);
    } else if (name == "preload") {
      const auto* array = node.as_array();
      if (!array) bad_type(node, name, doc);
      std::string list;
      for (const auto& item : *array) {
        const auto* module = item.as_string();
        if (!module || module->get().empty()) bad_type(item, name, doc);
        list += (list.empty() ? "" : ",") + module->get();
      }
      s.preload = list.empty() ? "none" : list;
    } else if (name == "output") {
      read_output(s, doc, node);
    } else if (name == "env") {
      read_env(s, doc, node);
    } else if (name == "slurm") {
      read_slurm(s, doc, node);
    }
  }

  void read_output(Settings& s, const KeyDoc& doc, const toml::node& node) const {
    const auto* table = node.as_table();
    if (!table) bad_type(node, "output", doc);
    for (const auto& [key, value] : *table) {
      const std::string name(key.str());
      const std::string shown = "output." + name;
      const KeyDoc* sub = find_doc(kOutputKeys, name);
      if (!sub) unknown_key(key, shown, name, doc_names(kOutputKeys));
      if (name == "prefix") {
        s.prefix = boolean(value, shown, *sub);
      } else if (name == "ranks") {
        const auto* array = value.as_array();
        if (!array) bad_type(value, shown, *sub);
        static constexpr KeyDoc kRank = {"ranks", "a rank number (a non-negative integer)", "ranks = [0, 1]"};
        std::set<int> ranks;
        for (std::size_t i = 0; i < array->size(); ++i) {
          const std::string item = shown + "[" + std::to_string(i) + "]";
          ranks.insert(static_cast<int>(integer(*array->get(i), item, kRank, 0, INT_MAX)));
        }
        s.ranks = std::move(ranks);
      }
    }
  }

  void read_slurm(Settings& s, const KeyDoc& doc, const toml::node& node) const {
    const auto* table = node.as_table();
    if (!table) bad_type(node, "slurm", doc);
    SlurmSettings& slurm = s.slurm;
    for (const auto& [key, value] : *table) {
      const std::string name(key.str());
      const std::string shown = "slurm." + name;
      const KeyDoc* sub = find_doc(kSlurmKeys, name);
      if (!sub) unknown_key(key, shown, name, doc_names(kSlurmKeys));
      auto text = [&] {
        const auto* v = value.as_string();
        if (!v) bad_type(value, shown, *sub);
        if (v->get().empty()) bad(value, shown, *sub, "an empty string");
        return v->get();
      };
      if (name == "partition") slurm.partition = text();
      else if (name == "account") slurm.account = text();
      else if (name == "qos") slurm.qos = text();
      else if (name == "time") slurm.time = text();
      else if (name == "mem") slurm.mem = text();
      else if (name == "constraint") slurm.constraint = text();
      else if (name == "gpus_per_node") slurm.gpus_per_node = static_cast<int>(integer(value, shown, *sub, 0, 1 << 16));
      else if (name == "cpus_per_task") slurm.cpus_per_task = static_cast<int>(integer(value, shown, *sub, 1, 1 << 20));
      else if (name == "signal") {
        try {
          slurm.signal = checked_warning_signal(text(), shown);
        } catch (const ConfigError& e) {
          fail(value.source(), e.what());
        }
      } else if (name == "requeue") slurm.requeue = boolean(value, shown, *sub);
      else if (name == "extra") {
        const auto* array = value.as_array();
        if (!array) bad_type(value, shown, *sub);
        for (std::size_t i = 0; i < array->size(); ++i) {
          const auto* line = array->get(i)->as_string();
          if (!line || line->get().empty() || line->get().find('\n') != std::string::npos)
            bad(*array->get(i), shown + "[" + std::to_string(i) + "]", *sub, line ? "an empty or multi-line string" : type_phrase(*array->get(i)));
          slurm.extra.push_back(line->get());
        }
      }
    }
  }

  void read_env(Settings& s, const KeyDoc& doc, const toml::node& node) const {
    const auto* table = node.as_table();
    if (!table) bad_type(node, "env", doc);
    for (const auto& [key, value] : *table) {
      const std::string name(key.str());
      const std::string shown = "env." + name;
      if (name.empty() || name.find('=') != std::string::npos ||
          name.find('\0') != std::string::npos) {
        fail(key.source(), "environment variable name '" + name +
                               "' in [env] must be non-empty and contain no '='; rename it");
      }
      const auto* text = value.as_string();
      if (!text) {
        fail(value.source(), "key '" + shown + "' must be a string, got " + type_phrase(value) +
                                 "; quote the value, e.g. " + name + " = \"1\"");
      }
      s.env[name] = text->get();
    }
  }

  const std::string& origin_;
};

}  // namespace

Settings parse_config(std::string_view toml_text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source();
    throw ConfigError(origin + ":" + std::to_string(where.begin.line) + ":" +
                      std::to_string(where.begin.column) + ": invalid TOML: " +
                      std::string(e.description()) + "; fix the TOML syntax there");
  }
  return ConfigReader(origin).read(root);
}

Settings load_config_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("config file '" + path + "' is a directory; give the path of a TOML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw ConfigError("cannot read config file '" + path + "': " + std::strerror(err) +
                      "; check the path and its permissions");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    const int err = errno;
    throw ConfigError("cannot read config file '" + path + "': " + std::strerror(err) +
                      "; check the path and its permissions");
  }
  return parse_config(text.str(), path);
}

}  // namespace airhost::detail
