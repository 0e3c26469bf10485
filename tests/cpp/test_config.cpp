// test_config.cpp — the TOML config: every key, every error form with its position,
// merge precedence, durations, and the shipped configs/default.toml.
#include <doctest/doctest.h>

#include "support.hpp"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "airhost/launch.hpp"
#include "cli/config.hpp"

using namespace std::chrono_literals;
using airhost::detail::ConfigError;
using airhost::detail::Settings;
using airhost::detail::load_config_file;
using airhost::detail::parse_config;
using airhost::detail::parse_duration;
using airhost::detail::parse_duration_seconds;

using airhost_test::TempDir;

namespace {


// The message of the ConfigError that parsing `text` throws, or "" (and a failure) if none.
std::string config_error(const std::string& text) {
  try {
    parse_config(text, "cfg.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("no ConfigError for: " << text);
  return "";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every key of the config file is accepted and read") {
  const Settings s = parse_config(R"(
accelerators = 4
timeout = 3600
grace = "1m30s"
python = "/opt/venv/bin/python"
run_dir = "/scratch/runs/exp1"
master_addr = "10.0.0.1"
master_port = 29500
max_restarts = 3
nnodes = 4
node_rank = 3
node_timeout = "45s"
join_timeout = 120
warm = false
preload = ["torch", "numpy"]
preflight = true

[output]
prefix = false
ranks = [0, 2, 3]

[env]
NCCL_DEBUG = "INFO"
OMP_NUM_THREADS = "4"
)",
                                  "cfg.toml");
  CHECK(s.accelerators == 4);
  CHECK(s.timeout == 3600s);
  CHECK(s.grace == 90s);
  CHECK(s.python == "/opt/venv/bin/python");
  CHECK(s.run_dir == "/scratch/runs/exp1");
  CHECK(s.master_addr == "10.0.0.1");
  CHECK(s.master_port == 29500);
  CHECK(s.max_restarts == 3);
  CHECK(s.nnodes == 4);
  CHECK(s.node_rank == 3);
  CHECK(s.node_timeout == 45s);
  CHECK(s.join_timeout == 120s);
  CHECK(s.warm == false);
  CHECK(s.preload == "torch,numpy");
  CHECK(s.preflight == true);
  CHECK(s.prefix == false);
  CHECK(s.ranks == std::set<int>{0, 2, 3});
  CHECK(s.env == std::map<std::string, std::string>{{"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "4"}});
}

TEST_CASE("an empty config file gives no setting at all") {
  const Settings s = parse_config("# nothing here\n", "cfg.toml");
  CHECK_FALSE(s.accelerators);
  CHECK_FALSE(s.timeout);
  CHECK_FALSE(s.grace);
  CHECK_FALSE(s.python);
  CHECK_FALSE(s.run_dir);
  CHECK_FALSE(s.master_addr);
  CHECK_FALSE(s.master_port);
  CHECK_FALSE(s.max_restarts);
  CHECK_FALSE(s.nnodes);
  CHECK_FALSE(s.node_rank);
  CHECK_FALSE(s.node_timeout);
  CHECK_FALSE(s.join_timeout);
  CHECK_FALSE(s.preflight);
  CHECK_FALSE(s.prefix);
  CHECK_FALSE(s.ranks);
  CHECK(s.env.empty());
}

TEST_CASE("durations in the config file may be seconds or duration strings") {
  struct Case {
    std::string toml;
    std::optional<std::chrono::seconds> timeout;
    std::optional<std::chrono::milliseconds> grace;
  };
  const std::vector<Case> cases = {
      {"timeout = 0", 0s, std::nullopt},
      {"timeout = \"3h\"", 3h, std::nullopt},
      {"timeout = \"90m\"", 90min, std::nullopt},
      {"timeout = \"1h30m\"", 90min, std::nullopt},
      {"timeout = \"2d\"", 48h, std::nullopt},
      {"grace = 10", std::nullopt, 10s},
      {"grace = \"500ms\"", std::nullopt, 500ms},
      {"grace = \"0\"", std::nullopt, 0ms},
  };
  for (const auto& c : cases) {
    CAPTURE(c.toml);
    const Settings s = parse_config(c.toml, "cfg.toml");
    CHECK(s.timeout == c.timeout);
    CHECK(s.grace == c.grace);
  }
}

TEST_CASE("output and env may also be written as inline tables") {
  const Settings s = parse_config("output = { prefix = true, ranks = [] }\nenv = { A = \"1\" }\n", "cfg.toml");
  CHECK(s.prefix == true);
  CHECK(s.ranks == std::set<int>{});
  CHECK(s.env.at("A") == "1");
}

TEST_CASE("each config error names the file, line, column and key, and says what to do") {
  struct Case {
    std::string toml;
    std::string prefix;  // FILE:LINE:COLUMN: and the start of the sentence
    std::string hint;    // part of what the message tells the user to do
  };
  const std::vector<Case> cases = {
      {"timout = 5\n", "cfg.toml:1:1: unknown key 'timout' (did you mean 'timeout'?)",
       "see configs/default.toml for every key"},
      {"nproc_per_node = 4\n", "cfg.toml:1:1: unknown key 'nproc_per_node' (did you mean 'accelerators'?)",
       "see configs/default.toml"},
      {"[logging]\nlevel = 1\n", "cfg.toml:1:2: unknown key 'logging'", "see configs/default.toml"},
      {"[output]\ncolor = true\n", "cfg.toml:2:1: unknown key 'output.color'", "see configs/default.toml"},
      {"accelerators = -1\n", "cfg.toml:1:16: key 'accelerators' must be a non-negative integer",
       "got -1; e.g. accelerators = 4"},
      {"accelerators = \"4\"\n", "cfg.toml:1:16: key 'accelerators' must be a non-negative integer",
       "got a string; e.g. accelerators = 4"},
      {"accelerators = 2.0\n", "cfg.toml:1:16: key 'accelerators'", "got a floating-point number"},
      {"timeout = -3\n", "cfg.toml:1:11: key 'timeout' must not be negative, got -3", "e.g. timeout = \"3h\""},
      {"timeout = \"3x\"\n", "cfg.toml:1:11: key 'timeout' must be a duration like", "got '3x'; e.g. timeout = \"3h\""},
      {"timeout = \"1500ms\"\n", "cfg.toml:1:11: key 'timeout' must be a whole number of seconds, got '1500ms'",
       "e.g. timeout = \"3h\""},
      {"timeout = true\n", "cfg.toml:1:11: key 'timeout' must be seconds or a duration string", "got a boolean"},
      {"grace = \"-5s\"\n", "cfg.toml:1:9: key 'grace' must not be negative, got '-5s'", "e.g. grace = \"10s\""},
      {"\n\npython = 3\n", "cfg.toml:3:10: key 'python' must be a string", "got an integer"},
      {"run_dir = false\n", "cfg.toml:1:11: key 'run_dir' must be a string", "got a boolean"},
      {"master_addr = \"\"\n", "cfg.toml:1:15: key 'master_addr' must be a non-empty string", "got an empty string"},
      {"master_port = 70000\n", "cfg.toml:1:15: key 'master_port' must be an integer from 0 to 65535",
       "got 70000; e.g. master_port = 29500"},
      {"master_port = -1\n", "cfg.toml:1:15: key 'master_port'", "got -1"},
      {"max_restarts = 1001\n", "cfg.toml:1:16: key 'max_restarts' must be an integer from 0 to 1000", "got 1001"},
      {"nnodes = 0\n", "cfg.toml:1:10: key 'nnodes' must be a positive integer (the number of nodes)", "got 0"},
      {"nnodes = \"4:2\"\n", "cfg.toml:1:10: key 'nnodes' must be a positive integer (the number of nodes), or \"MIN:MAX\"",
       "got '4:2'"},
      {"node_rank = -1\n", "cfg.toml:1:13: key 'node_rank' must be a non-negative integer", "got -1"},
      {"node_timeout = 0\n", "cfg.toml:1:16: key 'node_timeout' must be a whole number of seconds, at least 1",
       "got 0; e.g. node_timeout = \"30s\""},
      {"join_timeout = \"500ms\"\n", "cfg.toml:1:16: key 'join_timeout' must be a whole number of seconds",
       "got '500ms'"},
      {"nodes = 2\n", "cfg.toml:1:1: unknown key 'nodes' (did you mean 'nnodes'?)", "see configs/default.toml"},
      {"preload = \"torch\"\n", "cfg.toml:1:11: key 'preload' must be an array of module names", "preload = [\"torch\", \"numpy\"]"},
      {"warm = 1\n", "cfg.toml:1:8: key 'warm' must be a boolean", "warm = false"},
      {"preflight = \"yes\"\n", "cfg.toml:1:13: key 'preflight' must be a boolean, got a string",
       "e.g. preflight = true"},
      {"\n[output]\nprefix = \"yes\"\n", "cfg.toml:3:10: key 'output.prefix' must be a boolean, got a string",
       "e.g. prefix = false"},
      {"[output]\nranks = [0, -1]\n", "cfg.toml:2:13: key 'output.ranks[1]' must be a rank number", "got -1"},
      {"[output]\nranks = [\"0\"]\n", "cfg.toml:2:10: key 'output.ranks[0]' must be a rank number", "got a string"},
      {"[output]\nranks = 3\n", "cfg.toml:2:9: key 'output.ranks' must be an array", "e.g. ranks = [0, 1]"},
      {"output = 3\n", "cfg.toml:1:10: key 'output' must be a table, got an integer", "[output]"},
      {"env = \"A=1\"\n", "cfg.toml:1:7: key 'env' must be a table of strings, got a string", "[env]"},
      {"[env]\nA = 3\n", "cfg.toml:2:5: key 'env.A' must be a string, got an integer", "quote the value"},
      {"[env]\n\"A=B\" = \"x\"\n", "cfg.toml:2:1: environment variable name 'A=B'", "rename it"},
      {"accelerators = = 3\n", "cfg.toml:1:16: invalid TOML:", "fix the TOML syntax there"},
      {"timeout = 1\ntimeout = 2\n", "cfg.toml:2:11: invalid TOML:", "fix the TOML syntax there"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.toml);
    const std::string message = config_error(c.toml);
    CHECK_MESSAGE(starts_with(message, c.prefix), message);
    CHECK_MESSAGE(contains(message, c.hint), message);
  }
}

TEST_CASE("merge lets every given field of the later layer win") {
  Settings file;
  file.accelerators = 2;
  file.timeout = 60s;
  file.grace = 5s;
  file.python = "/file/python";
  file.run_dir = "/file/runs";
  file.master_addr = "10.0.0.1";
  file.master_port = 1000;
  file.preflight = true;
  file.prefix = false;
  file.ranks = std::set<int>{1};
  file.env = {{"A", "file"}, {"B", "file"}};

  SUBCASE("an empty layer changes nothing") {
    Settings merged = file;
    merged.merge(Settings{});
    CHECK(merged.accelerators == 2);
    CHECK(merged.timeout == 60s);
    CHECK(merged.grace == 5s);
    CHECK(merged.python == "/file/python");
    CHECK(merged.run_dir == "/file/runs");
    CHECK(merged.master_addr == "10.0.0.1");
    CHECK(merged.master_port == 1000);
    CHECK(merged.preflight == true);
    CHECK(merged.prefix == false);
    CHECK(merged.ranks == std::set<int>{1});
    CHECK(merged.env == file.env);
  }

  SUBCASE("given fields replace, and env merges name by name") {
    Settings flags;
    flags.accelerators = 8;
    flags.timeout = 0s;
    flags.grace = 1s;
    flags.python = "";
    flags.run_dir = "/flag/runs";
    flags.master_addr = "127.0.0.1";
    flags.master_port = 0;
    flags.preflight = false;
    flags.prefix = true;
    flags.ranks = std::set<int>{};
    flags.env = {{"B", "flag"}, {"C", "flag"}};
    Settings merged = file;
    merged.merge(flags);
    CHECK(merged.accelerators == 8);
    CHECK(merged.timeout == 0s);
    CHECK(merged.grace == 1s);
    CHECK(merged.python == "");
    CHECK(merged.run_dir == "/flag/runs");
    CHECK(merged.master_addr == "127.0.0.1");
    CHECK(merged.master_port == 0);
    CHECK(merged.preflight == false);
    CHECK(merged.prefix == true);
    CHECK(merged.ranks == std::set<int>{});
    CHECK(merged.env == std::map<std::string, std::string>{{"A", "file"}, {"B", "flag"}, {"C", "flag"}});
  }
}

TEST_CASE("parse_duration reads seconds, units and unit combinations") {
  struct Case {
    std::string text;
    std::chrono::milliseconds expected;
  };
  const std::vector<Case> cases = {
      {"0", 0ms},         {"90", 90s},        {"90s", 90s},      {"15m", 15min},
      {"3h", 3h},         {"1h30m", 90min},   {"500ms", 500ms},  {"2d", 48h},
      {"1m30s", 90s},     {"1s500ms", 1500ms}, {"1d2h3m4s5ms", 93'784'005ms},
      {" 10s ", 10s},     {"0s", 0ms},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(parse_duration(c.text, "--grace") == c.expected);
  }
}

TEST_CASE("parse_duration rejects negatives, empty text and junk, naming the setting and the text") {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::string forms = "must be a duration like 90 (seconds), 90s, 15m, 3h, 1h30m, 7d or 500ms";
  const std::vector<Case> cases = {
      {"", "--timeout " + forms + ", got ''"},
      {"   ", "--timeout " + forms + ", got '   '"},
      {"-5", "--timeout must not be negative, got '-5'"},
      {"-1h", "--timeout must not be negative, got '-1h'"},
      {"abc", "--timeout " + forms + ", got 'abc'"},
      {"3x", "--timeout " + forms + ", got '3x'"},
      {"h", "--timeout " + forms + ", got 'h'"},
      {"1.5h", "--timeout " + forms + ", got '1.5h'"},
      {"1h30", "--timeout " + forms + ", got '1h30'"},
      {"30m1h", "--timeout " + forms + ", got '30m1h'"},
      {"1h1h", "--timeout " + forms + ", got '1h1h'"},
      {"3H", "--timeout " + forms + ", got '3H'"},
      {"+5", "--timeout " + forms + ", got '+5'"},
      {"99999999999999999999", "--timeout is too large, got '99999999999999999999'"},
      {"999999999999d", "--timeout is too large, got '999999999999d'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(parse_duration(c.text, "--timeout"), c.message.c_str(), ConfigError);
  }
}

TEST_CASE("parse_duration_seconds refuses a remainder below one second") {
  CHECK(parse_duration_seconds("2m", "--timeout") == 120s);
  CHECK(parse_duration_seconds("2000ms", "--timeout") == 2s);
  CHECK_THROWS_WITH_AS(parse_duration_seconds("500ms", "--timeout"),
                       "--timeout must be a whole number of seconds, got '500ms'; round it, e.g. '2s' or '1m'",
                       ConfigError);
}

TEST_CASE("closest_name suggests only near misses") {
  using airhost::detail::closest_name;
  const std::vector<std::string> names = {"timeout", "grace", "python"};
  CHECK(closest_name("timout", names) == "timeout");
  CHECK(closest_name("graec", names) == "grace");
  CHECK_FALSE(closest_name("colour", names));
  CHECK_FALSE(closest_name("x", names));
}

TEST_CASE("load_config_file reads a file and reports errors with its path") {
  TempDir dir;
  SUBCASE("a valid file") {
    const auto path = dir.write("airhost.toml", "accelerators = 2\n[env]\nA = \"b\"\n");
    const Settings s = load_config_file(path);
    CHECK(s.accelerators == 2);
    CHECK(s.env.at("A") == "b");
  }
  SUBCASE("an error inside the file starts with PATH:LINE:COLUMN") {
    const auto path = dir.write("bad.toml", "# comment\nmaster_port = 70000\n");
    const std::string expected = path + ":2:15: key 'master_port' must be an integer from 0 to 65535";
    CHECK_THROWS_WITH_AS(load_config_file(path), doctest::Contains(expected.c_str()), ConfigError);
  }
  SUBCASE("a missing file is named") {
    const auto path = dir.path() + "/missing.toml";
    CHECK_THROWS_WITH_AS(load_config_file(path),
                         ("cannot read config file '" + path +
                          "': No such file or directory; check the path and its permissions")
                             .c_str(),
                         ConfigError);
  }
  SUBCASE("a directory is refused by name") {
    CHECK_THROWS_WITH_AS(load_config_file(dir.path()),
                         ("config file '" + dir.path() + "' is a directory; give the path of a TOML file").c_str(),
                         ConfigError);
  }
}

#ifdef AIRHOST_SOURCE_DIR
TEST_CASE("configs/default.toml is valid and matches the built-in defaults") {
  const Settings s = load_config_file(std::string(AIRHOST_SOURCE_DIR) + "/configs/default.toml");
  const airhost::LaunchSpec spec;
  CHECK(s.accelerators == 0);
  CHECK(s.timeout == spec.timeout);
  CHECK(s.grace == spec.grace);
  CHECK(s.python == spec.python);
  CHECK(s.run_dir == spec.run_dir);
  CHECK_FALSE(s.master_addr);  // left out, so that Slurm's or Kubernetes' can apply (cluster_env.hpp)
  CHECK(s.master_port == spec.master_port);
  CHECK(s.max_restarts == spec.max_restarts);
  CHECK(s.nnodes == spec.nnodes);
  CHECK(s.node_rank == spec.node_rank);
  CHECK(s.node_timeout == spec.node_timeout);
  CHECK(s.join_timeout == spec.join_timeout);
  CHECK_FALSE(s.nnodes_min);
  CHECK(s.join_settle == spec.join_settle);
  CHECK(s.scale_up_interval == spec.scale_up_interval);
  CHECK(s.warm == true);
  CHECK_FALSE(s.preload);
  CHECK(s.preflight == false);
  CHECK(s.prefix == spec.output.prefix);
  CHECK(s.ranks == spec.output.ranks);
  CHECK(s.env.empty());
}
#endif

TEST_CASE("nnodes = \"MIN:MAX\" is an elastic job, and a fixed count over it makes it fixed again") {
  Settings s = parse_config("nnodes = \"2:4\"\njoin_settle = \"1s\"\n", "cfg.toml");
  CHECK(s.nnodes == 4);
  CHECK(s.nnodes_min == 2);
  CHECK(s.join_settle == std::chrono::milliseconds(1000));
  Settings flags;
  flags.nnodes = 3;
  s.merge(flags);
  CHECK(s.nnodes == 3);
  CHECK_FALSE(s.nnodes_min);
}
