// test_cli.cpp — the command line: every target form, every flag in both spellings, flags
// after the target, `--`, the config file layers, and each error message.
#include <doctest/doctest.h>

#include "support.hpp"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/command_line.hpp"

using namespace std::chrono_literals;
using airhost::Entry;
using airhost::detail::Command;
using airhost::detail::ConfigError;
using airhost::detail::HostOptions;
using airhost::detail::parse_command_line;
using airhost::detail::usage_text;

using airhost_test::TempDir;

namespace {


std::vector<std::string> with_program(std::vector<std::string> args) {
  args.insert(args.begin(), "airhost");
  return args;
}

HostOptions parse(const std::vector<std::string>& args, const std::string& cwd) {
  return parse_command_line(with_program(args), cwd);
}

std::string join(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

// The message of the ConfigError that parsing `args` throws, or "" (and a failure) if none.
std::string cli_error(const std::vector<std::string>& args, const std::string& cwd) {
  try {
    parse(args, cwd);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL_CHECK("no ConfigError for: airhost " << join(args));
  return "";
}

}  // namespace

TEST_CASE("each target form becomes the matching entry") {
  TempDir cwd;
  struct Case {
    std::vector<std::string> args;
    Entry::Kind kind;
    std::string target;
    std::string function;
    bool module_target;
  };
  const std::vector<Case> cases = {
      {{"train.py"}, Entry::Kind::script, "train.py", "", false},
      {{"scripts/train.py"}, Entry::Kind::script, "scripts/train.py", "", false},
      {{"train.py:main"}, Entry::Kind::function, "train.py", "main", false},
      {{"dir/train.py:_run2"}, Entry::Kind::function, "dir/train.py", "_run2", false},
      {{"-m", "pkg.train"}, Entry::Kind::module, "pkg.train", "", true},
      {{"-m", "pkg.train:main"}, Entry::Kind::function, "pkg.train", "main", true},
      {{"-m=pkg"}, Entry::Kind::module, "pkg", "", true},
      {{"-mpkg.sub:fn"}, Entry::Kind::function, "pkg.sub", "fn", true},
      // A colon whose suffix is no Python name is part of the path.
      {{"a:b/train.py"}, Entry::Kind::script, "a:b/train.py", "", false},
      {{"run:1.py"}, Entry::Kind::script, "run:1.py", "", false},
      {{"train.py:"}, Entry::Kind::script, "train.py:", "", false},
      {{":main"}, Entry::Kind::script, ":main", "", false},
      {{"doctor.py"}, Entry::Kind::script, "doctor.py", "", false},
  };
  for (const auto& c : cases) {
    CAPTURE(join(c.args));
    const HostOptions o = parse(c.args, cwd.path());
    CHECK(o.command == Command::run);
    CHECK(o.entry.kind == c.kind);
    CHECK(o.entry.target == c.target);
    CHECK(o.entry.function == c.function);
    CHECK(o.module_target == c.module_target);
    CHECK(o.entry.args.empty());
  }
}

TEST_CASE("everything after the first -- is the script's arguments") {
  TempDir cwd;
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> script_args;
  };
  const std::vector<Case> cases = {
      {{"train.py", "--"}, {}},
      {{"train.py", "--", "--lr", "0.1"}, {"--lr", "0.1"}},
      {{"train.py", "--", "--", "-n", "3", "--help"}, {"--", "-n", "3", "--help"}},
      {{"-m", "pkg", "--", "x", "--version"}, {"x", "--version"}},
      {{"-n", "2", "train.py:main", "-n", "3", "--", "-n", "4"}, {"-n", "4"}},
  };
  for (const auto& c : cases) {
    CAPTURE(join(c.args));
    const HostOptions o = parse(c.args, cwd.path());
    CHECK(o.entry.args == c.script_args);
    CHECK(o.command == Command::run);
  }
  // The flags before `--` still count, the ones after it don't.
  CHECK(parse({"-n", "2", "train.py", "-n", "3", "--", "-n", "4"}, cwd.path()).settings.accelerators == 3);
}

TEST_CASE("every flag is read in its --flag VALUE and --flag=VALUE forms, before or after the target") {
  TempDir cwd;
  struct Case {
    std::vector<std::string> flag;  // one flag, as one or two tokens
    void (*check)(const HostOptions&);
  };
  const std::vector<Case> cases = {
      {{"--accelerators", "4"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 4); }},
      {{"--accelerators=4"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 4); }},
      {{"--nproc-per-node", "3"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 3); }},
      {{"--nproc-per-node=3"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 3); }},
      {{"--nproc_per_node", "5"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 5); }},
      {{"--nproc_per_node=5"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 5); }},
      {{"-n", "2"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 2); }},
      {{"-n=2"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 2); }},
      {{"-n2"}, [](const HostOptions& o) { CHECK(o.settings.accelerators == 2); }},
      {{"--timeout", "90m"}, [](const HostOptions& o) { CHECK(o.settings.timeout == 90min); }},
      {{"--timeout=0"}, [](const HostOptions& o) { CHECK(o.settings.timeout == 0s); }},
      {{"--timeout", "120"}, [](const HostOptions& o) { CHECK(o.settings.timeout == 120s); }},
      {{"--grace", "500ms"}, [](const HostOptions& o) { CHECK(o.settings.grace == 500ms); }},
      {{"--grace=1m"}, [](const HostOptions& o) { CHECK(o.settings.grace == 60s); }},
      {{"--python", "/opt/py/bin/python"}, [](const HostOptions& o) { CHECK(o.settings.python == "/opt/py/bin/python"); }},
      {{"--python="}, [](const HostOptions& o) { CHECK(o.settings.python == ""); }},
      {{"--run-dir", "runs/x"}, [](const HostOptions& o) { CHECK(o.settings.run_dir == "runs/x"); }},
      {{"--run-dir=/tmp/r=1"}, [](const HostOptions& o) { CHECK(o.settings.run_dir == "/tmp/r=1"); }},
      {{"--master-addr", "10.1.2.3"}, [](const HostOptions& o) { CHECK(o.settings.master_addr == "10.1.2.3"); }},
      {{"--master-addr=host"}, [](const HostOptions& o) { CHECK(o.settings.master_addr == "host"); }},
      {{"--master-port", "29500"}, [](const HostOptions& o) { CHECK(o.settings.master_port == 29500); }},
      {{"--master-port=0"}, [](const HostOptions& o) { CHECK(o.settings.master_port == 0); }},
      {{"--master-port=65535"}, [](const HostOptions& o) { CHECK(o.settings.master_port == 65535); }},
      {{"--max-restarts", "3"}, [](const HostOptions& o) { CHECK(o.settings.max_restarts == 3); }},
      {{"--max_restarts=0"}, [](const HostOptions& o) { CHECK(o.settings.max_restarts == 0); }},
      {{"--nnodes", "2"}, [](const HostOptions& o) { CHECK(o.settings.nnodes == 2); }},
      {{"--nnodes=16"}, [](const HostOptions& o) {
         CHECK(o.settings.nnodes == 16);
         CHECK_FALSE(o.settings.nnodes_min);
       }},
      {{"--nnodes", "2:4", "--join-settle", "500ms"}, [](const HostOptions& o) {
         CHECK(o.settings.nnodes == 4);
         CHECK(o.settings.nnodes_min == 2);
         CHECK(o.settings.join_settle == std::chrono::milliseconds(500));
       }},
      {{"--nnodes=3:3"}, [](const HostOptions& o) {
         CHECK(o.settings.nnodes == 3);
         CHECK_FALSE(o.settings.nnodes_min);
       }},
      {{"--node-rank", "1"}, [](const HostOptions& o) { CHECK(o.settings.node_rank == 1); }},
      {{"--node_rank=0"}, [](const HostOptions& o) { CHECK(o.settings.node_rank == 0); }},
      {{"--node-timeout", "3"}, [](const HostOptions& o) { CHECK(o.settings.node_timeout == 3s); }},
      {{"--node-timeout=1m"}, [](const HostOptions& o) { CHECK(o.settings.node_timeout == 60s); }},
      {{"--join-timeout", "10m"}, [](const HostOptions& o) { CHECK(o.settings.join_timeout == 600s); }},
      {{"--preload", "torch,numpy"}, [](const HostOptions& o) { CHECK(o.settings.preload == "torch,numpy"); }},
      {{"--cold"}, [](const HostOptions& o) { CHECK(o.settings.warm == false); }},
      {{"--no-prefix"}, [](const HostOptions& o) { CHECK(o.settings.prefix == false); }},
      {{"--prefix"}, [](const HostOptions& o) { CHECK(o.settings.prefix == true); }},
      {{"--ranks", "0,2,3"}, [](const HostOptions& o) { CHECK(o.settings.ranks == std::set<int>{0, 2, 3}); }},
      {{"--ranks=1"}, [](const HostOptions& o) { CHECK(o.settings.ranks == std::set<int>{1}); }},
      {{"--ranks", "3, 1"}, [](const HostOptions& o) { CHECK(o.settings.ranks == std::set<int>{1, 3}); }},
      {{"--ranks=all"}, [](const HostOptions& o) { CHECK(o.settings.ranks == std::set<int>{}); }},
      {{"--env", "A=1"}, [](const HostOptions& o) { CHECK(o.settings.env.at("A") == "1"); }},
      {{"--env=A=x=y"}, [](const HostOptions& o) { CHECK(o.settings.env.at("A") == "x=y"); }},
      {{"--env", "EMPTY="}, [](const HostOptions& o) { CHECK(o.settings.env.at("EMPTY") == ""); }},
      {{"--preflight"}, [](const HostOptions& o) { CHECK(o.settings.preflight == true); }},
  };
  for (const auto& c : cases) {
    std::vector<std::string> before = c.flag;
    before.push_back("train.py");
    std::vector<std::string> after = {"train.py"};
    after.insert(after.end(), c.flag.begin(), c.flag.end());
    for (const auto& args : {before, after}) {
      CAPTURE(join(args));
      const HostOptions o = parse(args, cwd.path());
      CHECK(o.command == Command::run);
      CHECK(o.entry.target == "train.py");
      c.check(o);
    }
  }
}

TEST_CASE("flags not given stay unset, and repeated flags keep the last value") {
  TempDir cwd;
  const HostOptions plain = parse({"train.py"}, cwd.path());
  CHECK_FALSE(plain.settings.accelerators);
  CHECK_FALSE(plain.settings.timeout);
  CHECK_FALSE(plain.settings.prefix);
  CHECK(plain.settings.env.empty());
  CHECK(plain.config_path.empty());
  CHECK_FALSE(plain.json);

  const HostOptions o = parse({"-n", "2", "train.py", "--no-prefix", "--prefix", "-n", "6", "--env", "A=1",
                               "--env", "B=2", "--env", "A=3"},
                              cwd.path());
  CHECK(o.settings.accelerators == 6);
  CHECK(o.settings.prefix == true);
  CHECK(o.settings.env == std::map<std::string, std::string>{{"A", "3"}, {"B", "2"}});
}

TEST_CASE("help and version win over everything else before --") {
  TempDir cwd;
  cwd.write("airhost.toml", "this is not toml\n");  // not read for --help
  struct Case {
    std::vector<std::string> args;
    Command command;
  };
  const std::vector<Case> cases = {
      {{"-h"}, Command::help},
      {{"--help"}, Command::help},
      {{"train.py", "--help"}, Command::help},
      {{"--bogus", "-h"}, Command::help},
      {{"-n", "0", "--help"}, Command::help},
      {{"-V"}, Command::version},
      {{"--version"}, Command::version},
      {{"doctor", "--version"}, Command::version},
      {{"--version", "--help"}, Command::version},
  };
  for (const auto& c : cases) {
    CAPTURE(join(c.args));
    CHECK(parse(c.args, cwd.path()).command == c.command);
  }
}

TEST_CASE("airhost doctor is a subcommand, with --json") {
  TempDir cwd;
  const HostOptions plain = parse({"doctor"}, cwd.path());
  CHECK(plain.command == Command::doctor);
  CHECK_FALSE(plain.json);
  CHECK(parse({"doctor", "--json"}, cwd.path()).json);
  CHECK(parse({"--json", "doctor"}, cwd.path()).json);
  // Settings still apply: doctor may look at the interpreter the run would use.
  CHECK(parse({"doctor", "--python", "/x/python"}, cwd.path()).settings.python == "/x/python");
}

TEST_CASE("the config file sits under the flags") {
  TempDir cwd;
  SUBCASE("airhost.toml in cwd is read when present") {
    const auto path = cwd.write("airhost.toml", "accelerators = 2\ntimeout = \"1h\"\n[env]\nA = \"file\"\nB = \"file\"\n");
    const HostOptions o = parse({"train.py", "-n", "4", "--env", "B=flag"}, cwd.path());
    CHECK(o.config_path == path);
    CHECK(o.settings.accelerators == 4);  // flag wins
    CHECK(o.settings.timeout == 1h);      // file fills what flags leave out
    CHECK(o.settings.env == std::map<std::string, std::string>{{"A", "file"}, {"B", "flag"}});
  }
  SUBCASE("--config replaces airhost.toml, and a relative path is taken from cwd") {
    cwd.write("airhost.toml", "accelerators = 2\n");
    const auto path = cwd.write("conf/other.toml", "accelerators = 3\n[output]\nranks = [1]\n");
    const HostOptions o = parse({"--config", "conf/other.toml", "train.py", "--ranks", "all"}, cwd.path());
    CHECK(o.config_path == path);
    CHECK(o.settings.accelerators == 3);
    CHECK(o.settings.ranks == std::set<int>{});  // --ranks all undoes the file's filter
  }
  SUBCASE("--config=FILE with an absolute path") {
    const auto path = cwd.write("abs.toml", "master_port = 1234\n");
    const HostOptions o = parse({"train.py", "--config=" + path}, cwd.path());
    CHECK(o.config_path == path);
    CHECK(o.settings.master_port == 1234);
  }
  SUBCASE("a missing --config file is an error naming it") {
    const std::string message = cli_error({"--config", "nope.toml", "train.py"}, cwd.path());
    CHECK(message.rfind("cannot read config file '" + cwd.path() + "/nope.toml'", 0) == 0);
  }
  SUBCASE("an error in airhost.toml carries its path, line and column") {
    const auto path = cwd.write("airhost.toml", "\ntimeout = \"soon\"\n");
    const std::string message = cli_error({"train.py"}, cwd.path());
    CHECK(message.rfind(path + ":2:11: key 'timeout'", 0) == 0);
  }
}

TEST_CASE("each command-line error is one sentence that says what to do") {
  TempDir cwd;
  const std::string hint = "script arguments go after `--`, e.g. airhost train.py -- --lr 0.1";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--bogus", "train.py"}, "unknown flag '--bogus'; run airhost --help for every flag"},
      {{"--acelerators", "2", "train.py"},
       "unknown flag '--acelerators' (did you mean '--accelerators'?); run airhost --help for every flag"},
      {{"-x", "train.py"}, "unknown flag '-x'; run airhost --help for every flag"},
      {{"train.py", "--lr", "0.1"}, "unknown flag '--lr'; " + hint},
      {{"train.py", "--lr=0.1"}, "unknown flag '--lr=0.1'; " + hint},
      {{"train.py", "-v"}, "unknown flag '-v'; " + hint},
      {{"train.py", "--timout", "1h"}, "unknown flag '--timout' (did you mean '--timeout'?); " + hint},
      {{"train.py", "0.1"},
       "two targets given, 'train.py' and '0.1'; run one target, and put script arguments after `--`, e.g. "
       "airhost train.py -- 0.1"},
      {{"a.py", "b.py"},
       "two targets given, 'a.py' and 'b.py'; run one target, and put script arguments after `--`, e.g. "
       "airhost a.py -- b.py"},
      {{"a.py", "-m", "pkg"},
       "two targets given, 'a.py' and '-m pkg'; run one target, and put script arguments after `--`, e.g. "
       "airhost a.py -- -m pkg"},
      {{"-m", "pkg", "doctor"},
       "two targets given, '-m pkg' and 'doctor'; run one target, and put script arguments after `--`, e.g. "
       "airhost -m pkg -- doctor"},
      {{}, "nothing to run: give a script (airhost train.py), a module (airhost -m pkg.train) or a subcommand "
           "(airhost doctor); see airhost --help"},
      {{"-n", "2"}, "nothing to run: give a script (airhost train.py), a module (airhost -m pkg.train) or a "
                    "subcommand (airhost doctor); see airhost --help"},
      {{"--", "train.py"}, "nothing to run: give a script (airhost train.py), a module (airhost -m pkg.train) or a "
                           "subcommand (airhost doctor); see airhost --help"},
      {{"--accelerators", "0", "train.py"},
       "--accelerators must be a positive integer, got '0'; leave it out to start one rank per visible GPU"},
      {{"--nnodes", "0", "train.py"},
       "--nnodes must be a positive integer (the number of nodes), or MIN:MAX for an elastic job (1 <= MIN <= MAX), "
       "got '0'; e.g. --nnodes 2 or --nnodes 2:4"},
      {{"--nnodes=two", "train.py"},
       "--nnodes must be a positive integer (the number of nodes), or MIN:MAX for an elastic job (1 <= MIN <= MAX), "
       "got 'two'; e.g. --nnodes 2 or --nnodes 2:4"},
      {{"--nnodes=4:2", "train.py"},
       "--nnodes must be a positive integer (the number of nodes), or MIN:MAX for an elastic job (1 <= MIN <= MAX), "
       "got '4:2'; e.g. --nnodes 2 or --nnodes 2:4"},
      {{"--node-rank", "-1", "train.py"},
       "--node-rank must be a non-negative integer (0 for the node at --master-addr), got '-1'; e.g. --node-rank 0"},
      {{"--node-rank=-1", "train.py"},
       "--node-rank must be a non-negative integer (0 for the node at --master-addr), got '-1'; e.g. --node-rank 0"},
      {{"--node-timeout", "0", "train.py"}, "--node-timeout must be at least 1 second, got '0'; e.g. --node-timeout 30s"},
      {{"--join-timeout", "1500ms", "train.py"},
       "--join-timeout must be a whole number of seconds, got '1500ms'; round it, e.g. '2s' or '1m'"},
      {{"--accelerators=abc", "train.py"},
       "--accelerators must be a positive integer, got 'abc'; leave it out to start one rank per visible GPU"},
      {{"-n", "-2", "train.py"},
       "-n must be a positive integer, got '-2'; leave it out to start one rank per visible GPU"},
      {{"--nproc-per-node", "1.5", "train.py"},
       "--nproc-per-node must be a positive integer, got '1.5'; leave it out to start one rank per visible GPU"},
      {{"-n", "99999999999", "train.py"},
       "-n must be a positive integer, got '99999999999'; leave it out to start one rank per visible GPU"},
      {{"train.py", "--accelerators"}, "--accelerators needs a value, e.g. --accelerators 4"},
      {{"train.py", "-n"}, "-n needs a value, e.g. -n 4"},
      {{"--timeout", "--", "x"}, "--timeout needs a value, e.g. --timeout 3h"},
      {{"--python", "--preflight", "train.py"}, "--python needs a value, e.g. --python /usr/bin/python3"},
      {{"train.py", "--env"}, "--env needs a value, e.g. --env NCCL_DEBUG=INFO"},
      {{"-m"}, "-m needs a module name, e.g. -m pkg.train"},
      {{"train.py", "--timeout", "soon"},
       "--timeout must be a duration like 90 (seconds), 90s, 15m, 3h, 1h30m, 7d or 500ms, got 'soon'"},
      {{"train.py", "--timeout=-1h"}, "--timeout must not be negative, got '-1h'"},
      {{"train.py", "--timeout", "1500ms"},
       "--timeout must be a whole number of seconds, got '1500ms'; round it, e.g. '2s' or '1m'"},
      {{"train.py", "--grace", "x"},
       "--grace must be a duration like 90 (seconds), 90s, 15m, 3h, 1h30m, 7d or 500ms, got 'x'"},
      {{"train.py", "--master-port", "70000"},
       "--master-port must be an integer from 0 to 65535 (0 = a free port), got '70000'; e.g. --master-port 29500"},
      {{"train.py", "--max-restarts", "-1"},
       "--max-restarts must be an integer from 0 to 1000, got '-1'; e.g. --max-restarts 3"},
      {{"train.py", "--max-restarts=lots"},
       "--max-restarts must be an integer from 0 to 1000, got 'lots'; e.g. --max-restarts 3"},
      {{"train.py", "--master-port=http"},
       "--master-port must be an integer from 0 to 65535 (0 = a free port), got 'http'; e.g. --master-port 29500"},
      {{"train.py", "--master-addr="}, "--master-addr must not be empty; e.g. --master-addr 10.0.0.1"},
      {{"train.py", "--ranks", "0,x"},
       "--ranks must be a comma-separated list of rank numbers or 'all', got '0,x'; e.g. --ranks 0,2,3"},
      {{"train.py", "--ranks", "-1"},
       "--ranks must be a comma-separated list of rank numbers or 'all', got '-1'; e.g. --ranks 0,2,3"},
      {{"train.py", "--ranks="},
       "--ranks must be a comma-separated list of rank numbers or 'all', got ''; e.g. --ranks 0,2,3"},
      {{"train.py", "--env", "FOO"}, "--env must be KEY=VALUE with a non-empty KEY, got 'FOO'; e.g. --env NCCL_DEBUG=INFO"},
      {{"train.py", "--env", "=1"}, "--env must be KEY=VALUE with a non-empty KEY, got '=1'; e.g. --env NCCL_DEBUG=INFO"},
      {{"train.py", "--config="}, "--config must name a file; e.g. --config airhost.toml"},
      {{"train.py", "--no-prefix=1"}, "--no-prefix takes no value, got '--no-prefix=1'; write --no-prefix alone"},
      {{"train.py", "--preflight=yes"}, "--preflight takes no value, got '--preflight=yes'; write --preflight alone"},
      {{"-m", "pkg/train.py"},
       "-m expects a dotted module name like pkg.train, got 'pkg/train.py'; to run a script file, drop -m "
       "(airhost train.py)"},
      {{"-m", "pkg..x"},
       "-m expects a dotted module name like pkg.train, got 'pkg..x'; to run a script file, drop -m (airhost "
       "train.py)"},
      {{"-m", "pkg:"},
       "-m expects MODULE or MODULE:FUNCTION with a Python name after ':', got 'pkg:'; e.g. -m pkg.train:main"},
      {{"-m", "pkg:1x"},
       "-m expects MODULE or MODULE:FUNCTION with a Python name after ':', got 'pkg:1x'; e.g. -m pkg.train:main"},
      {{"-"}, "airhost cannot read a script from standard input ('-'); save it to a file and give its path"},
      {{""}, "the target is an empty string; give a script path, e.g. airhost train.py"},
      {{"train.py", "--json"}, "--json only applies to airhost doctor; drop it, or run airhost doctor --json"},
      {{"doctor", "train.py"}, "airhost doctor takes no target, got 'train.py'; run airhost doctor alone"},
      {{"doctor", "-m", "pkg"}, "airhost doctor takes no target, got '-m pkg'; run airhost doctor alone"},
      {{"doctor", "--", "x"}, "airhost doctor takes no script arguments; drop everything after `--`"},
  };
  for (const auto& c : cases) {
    CAPTURE(join(c.args));
    CHECK(cli_error(c.args, cwd.path()) == c.message);
  }
}

TEST_CASE("the script file's existence is left to the launcher") {
  TempDir cwd;
  CHECK(parse({"does/not/exist.py"}, cwd.path()).entry.target == "does/not/exist.py");
}

TEST_CASE("the help text lists usage, every flag with its default, exit codes and the config lookup") {
  const std::string text = usage_text();
  for (const char* part : {
           "usage: airhost [flags] SCRIPT.py [flags] [-- script args]", "airhost doctor [--json]",
           "-m MODULE[:FUNCTION]", "SCRIPT.py:FUNCTION",
           "-n, --accelerators N", "--nproc-per-node", "--nproc_per_node", "one per visible GPU",
           "--timeout D", "(default: 3h)", "--grace D", "(default: 10s)", "--python P", "--run-dir D",
           "$AIRHOST_RUNS_DIR", "--master-addr A", "(default: 127.0.0.1)", "--master-port P",
           "a free port", "--prefix", "--no-prefix", "--ranks LIST", "--env KEY=VALUE", "--preflight",
           "--config FILE", "airhost.toml", "--json", "-h, --help", "-V, --version", "--flag=VALUE",
           "configs/default.toml", "Exit status:", "128+SIG", "124", "130/143", "  2 ",
           "--nnodes N", "--node-rank R", "--node-timeout D", "(default: 30s)", "--join-timeout D",
           "(default: 10m)", "138      several nodes",
       }) {
    CAPTURE(part);
    CHECK(text.find(part) != std::string::npos);
  }
}
