// accelerator_types.cpp — the accelerator type table (configs/accelerators.toml): where it
// is, reading and checking it, and the model an NVML device name belongs to.
#include "gpu/accelerator_types.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include <toml++/toml.h>

#include "base/errors.hpp"
#include "base/built_for.hpp"
#include "base/util.hpp"

namespace airhost::detail {

namespace {

std::string where(const std::string& path, const toml::source_region& region) {
  return path + ":" + std::to_string(region.begin.line) + ":" +
         std::to_string(region.begin.column) + ": ";
}

// Upper-cased tokens of an NVML name or a `match` entry: split at spaces and '-', the two
// separators NVML names use ("NVIDIA A100-SXM4-80GB").
std::vector<std::string> name_tokens(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (char c : text) {
    if (c == '-' || std::isspace(static_cast<unsigned char>(c))) {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
    } else {
      current += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

bool tokens_match(const std::vector<std::string>& name, const std::vector<std::string>& pattern) {
  if (pattern.empty() || pattern.size() > name.size()) return false;
  return std::search(name.begin(), name.end(), pattern.begin(), pattern.end()) != name.end();
}

}  // namespace

std::vector<AcceleratorType> load_accelerator_types(const std::string& toml_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(toml_path, ec)) {
    throw ConfigError("accelerator type table " + toml_path +
                      " does not exist or is not a file; reinstall airhost");
  }
  toml::table root;
  try {
    root = toml::parse_file(toml_path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(toml_path, e.source()) + std::string(e.description()));
  }

  for (auto&& [key, node] : root) {
    if (key.str() != "type") {
      throw ConfigError(where(toml_path, key.source()) + "unknown key '" +
                        std::string(key.str()) + "'; the file holds only [[type]] tables");
    }
  }
  const toml::array* rows = root["type"].as_array();
  if (!rows || !rows->is_array_of_tables() || rows->empty()) {
    throw ConfigError(toml_path + ":1:1: no [[type]] tables; see the format at the top of "
                      "configs/accelerators.toml");
  }

  std::vector<AcceleratorType> types;
  std::set<std::string> names;
  std::map<std::string, std::vector<std::string>> match_of_gpu;
  for (const toml::node& row_node : *rows) {
    const toml::table& row = *row_node.as_table();
    const std::string at = where(toml_path, row.source());
    for (auto&& [key, value] : row) {
      static const std::set<std::string_view> known = {"name", "gpu", "count", "match"};
      if (!known.count(key.str())) {
        throw ConfigError(where(toml_path, key.source()) + "unknown key '" +
                          std::string(key.str()) + "'; a [[type]] has name, gpu, count, match");
      }
    }
    auto text = [&](const char* key) {
      const toml::node* n = row.get(key);
      if (!n || !n->is_string() || n->as_string()->get().empty()) {
        throw ConfigError((n ? where(toml_path, n->source()) : at) + "key '" + key +
                          "' must be a non-empty string");
      }
      return n->as_string()->get();
    };
    AcceleratorType t;
    t.name = text("name");
    t.gpu = text("gpu");
    const toml::node* count = row.get("count");
    if (!count || !count->is_integer() || count->as_integer()->get() < 1 ||
        count->as_integer()->get() > 1024) {
      throw ConfigError((count ? where(toml_path, count->source()) : at) + "type '" + t.name +
                        "': key 'count' must be an integer from 1 to 1024");
    }
    t.count = static_cast<int>(count->as_integer()->get());
    const toml::node* match = row.get("match");
    const toml::array* match_array = match ? match->as_array() : nullptr;
    if (!match_array || match_array->empty()) {
      throw ConfigError((match ? where(toml_path, match->source()) : at) + "type '" + t.name +
                        "': key 'match' must be a non-empty array of strings");
    }
    for (const toml::node& m : *match_array) {
      if (!m.is_string() || name_tokens(m.as_string()->get()).empty()) {
        throw ConfigError(where(toml_path, m.source()) + "type '" + t.name +
                          "': every 'match' entry must be a string with a name token in it");
      }
      t.match.push_back(m.as_string()->get());
    }
    // The name is what users type; a count or model that disagrees with it would launch
    // the wrong number of ranks without a word.
    const std::string expected = "GPU_" + std::to_string(t.count) + "x" + t.gpu;
    if (t.name != expected) {
      throw ConfigError(at + "type '" + t.name + "' has gpu = \"" + t.gpu + "\" and count = " +
                        std::to_string(t.count) + ", so its name must be '" + expected + "'");
    }
    if (!names.insert(t.name).second) {
      throw ConfigError(at + "type '" + t.name + "' is defined twice");
    }
    auto [it, inserted] = match_of_gpu.emplace(t.gpu, t.match);
    if (!inserted && it->second != t.match) {
      throw ConfigError(at + "type '" + t.name + "': its 'match' differs from that of an "
                        "earlier type with gpu = \"" + t.gpu + "\"; the same model must match "
                        "the same names");
    }
    types.push_back(std::move(t));
  }
  return types;
}

std::optional<std::string> gpu_model_of(const std::vector<AcceleratorType>& types,
                                        const std::string& nvml_name) {
  const std::vector<std::string> name = name_tokens(nvml_name);
  for (const auto& t : types) {
    for (const auto& m : t.match) {
      if (tokens_match(name, name_tokens(m))) return t.gpu;
    }
  }
  return std::nullopt;
}

std::string find_accelerators_toml() {
  if (const char* env = std::getenv("AIRHOST_ACCELERATORS_TOML"); env && *env) return env;
  std::vector<std::string> candidates;
  const std::string exe = executable_path();
  if (!exe.empty()) {
    const std::string prefix = dirname_of(dirname_of(exe));
    candidates.push_back(prefix + "/share/airhost/accelerators.toml");
    // pip install: the binary in <env>/bin, the table in the package's configs/.
    candidates.push_back(prefix + "/lib/python" + built_python_version() + "/site-packages/airhost/configs/accelerators.toml");
  }
#ifdef AIRHOST_SOURCE_CONFIGS
  // The source tree a build tree's binary was compiled from (never in a wheel).
  candidates.push_back(AIRHOST_SOURCE_CONFIGS "/accelerators.toml");
#endif
  for (const auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return "";
}

}  // namespace airhost::detail
