// command_line.cpp — argv → HostOptions. Every mistake is caught here, before anything starts, with
// one sentence that says what was wrong and what to type instead.
#include "cli/command_line.hpp"

#include <charconv>
#include <climits>
#include <filesystem>
#include <optional>
#include <string_view>

#include "base/util.hpp"
#include "cli/retention.hpp"

namespace airhost::detail {

namespace {

enum class FlagId {
  accelerators, timeout, grace, python, run_dir, master_addr, master_port, max_restarts,
  nnodes, node_rank, node_timeout, join_timeout, join_settle, scale_up_interval, join_token_file,
  prefix, no_prefix, ranks, env, config, preflight, tracking, no_tracking, json, module, help, version,
  preload, cold, print_env, pickled, experiment, log_max_size, hang_timeout, on_hang,
};

struct FlagSpec {
  FlagId id;
  std::vector<std::string> names;  // the first one is used in messages about the flag
  bool takes_value;
  std::string example;             // a typical value, for "needs a value, e.g. ..."
};

const std::vector<FlagSpec>& flag_specs() {
  static const std::vector<FlagSpec> specs = {
      {FlagId::accelerators, {"--accelerators", "--nproc-per-node", "--nproc_per_node", "-n"}, true, "4"},
      {FlagId::timeout, {"--timeout"}, true, "3h"},
      {FlagId::grace, {"--grace"}, true, "30s"},
      {FlagId::hang_timeout, {"--hang-timeout"}, true, "30m"},
      {FlagId::on_hang, {"--on-hang"}, true, "stop"},
      {FlagId::python, {"--python"}, true, "/usr/bin/python3"},
      {FlagId::run_dir, {"--run-dir"}, true, "runs/exp1"},
      {FlagId::master_addr, {"--master-addr"}, true, "10.0.0.1"},
      {FlagId::master_port, {"--master-port"}, true, "29500"},
      {FlagId::max_restarts, {"--max-restarts", "--max_restarts"}, true, "3"},
      {FlagId::nnodes, {"--nnodes"}, true, "2"},
      {FlagId::node_rank, {"--node-rank", "--node_rank"}, true, "0"},
      {FlagId::node_timeout, {"--node-timeout"}, true, "30s"},
      {FlagId::join_timeout, {"--join-timeout"}, true, "10m"},
      {FlagId::join_settle, {"--join-settle"}, true, "3s"},
      {FlagId::scale_up_interval, {"--scale-up-interval"}, true, "1m"},
      {FlagId::join_token_file, {"--join-token-file"}, true, "/run/secrets/airhost-join-token"},
      {FlagId::prefix, {"--prefix"}, false, ""},
      {FlagId::no_prefix, {"--no-prefix"}, false, ""},
      {FlagId::ranks, {"--ranks"}, true, "0,2,3"},
      {FlagId::env, {"--env"}, true, "NCCL_DEBUG=INFO"},
      {FlagId::config, {"--config"}, true, "airhost.toml"},
      {FlagId::preflight, {"--preflight"}, false, ""},
      {FlagId::tracking, {"--tracking"}, false, ""},
      {FlagId::no_tracking, {"--no-tracking"}, false, ""},
      {FlagId::experiment, {"--experiment"}, true, "llama-sft"},
      {FlagId::log_max_size, {"--log-max-size"}, true, "100M"},
      {FlagId::json, {"--json"}, false, ""},
      {FlagId::preload, {"--preload"}, true, "torch,numpy"},
      {FlagId::cold, {"--cold"}, false, ""},
      {FlagId::print_env, {"--print-env"}, false, ""},
      {FlagId::module, {"-m"}, true, "pkg.train"},
      {FlagId::pickled, {"--pickled"}, true, "payload.pkl"},
      {FlagId::help, {"-h", "--help"}, false, ""},
      {FlagId::version, {"-V", "--version"}, false, ""},
  };
  return specs;
}

const FlagSpec* find_flag(std::string_view name) {
  for (const auto& spec : flag_specs())
    for (const auto& n : spec.names)
      if (n == name) return &spec;
  return nullptr;
}

std::vector<std::string> long_flag_names() {
  std::vector<std::string> names;
  for (const auto& spec : flag_specs())
    for (const auto& n : spec.names)
      if (n.size() > 2) names.push_back(n);
  return names;
}

constexpr std::string_view kScriptArgsHint =
    "script arguments go after `--`, e.g. airhost train.py -- --lr 0.1";

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  // Bytes >= 0x80 are let through: Python 3 accepts non-ASCII identifiers.
  auto word_char = [](unsigned char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c >= 0x80;
  };
  if (s.front() >= '0' && s.front() <= '9') return false;
  for (unsigned char c : s)
    if (!word_char(c)) return false;
  return true;
}

bool is_module_name(std::string_view s) {
  while (true) {
    const auto dot = s.find('.');
    if (!is_identifier(s.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    s.remove_prefix(dot + 1);
  }
}

std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

// `train.py`, or `train.py:main` when what follows the last ':' is a Python name.
Entry script_entry(const std::string& text) {
  Entry entry;
  const auto colon = text.rfind(':');
  if (colon != std::string::npos && colon > 0 && is_identifier(std::string_view(text).substr(colon + 1))) {
    entry.kind = Entry::Kind::function;
    entry.target = text.substr(0, colon);
    entry.function = text.substr(colon + 1);
  } else {
    entry.kind = Entry::Kind::script;
    entry.target = text;
  }
  return entry;
}

// `pkg.mod` or `pkg.mod:main`.
Entry module_entry(const std::string& text) {
  Entry entry;
  const auto colon = text.rfind(':');
  const std::string module = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string function = text.substr(colon + 1);
    if (!is_identifier(function)) {
      throw ConfigError("-m expects MODULE or MODULE:FUNCTION with a Python name after ':', got " +
                        single_quoted(text) + "; e.g. -m pkg.train:main");
    }
    entry.kind = Entry::Kind::function;
    entry.function = function;
  } else {
    entry.kind = Entry::Kind::module;
  }
  if (!is_module_name(module)) {
    throw ConfigError("-m expects a dotted module name like pkg.train, got " + single_quoted(text) +
                      "; to run a script file, drop -m (airhost train.py)");
  }
  entry.target = module;
  return entry;
}

class Parser {
 public:
  Parser(const std::vector<std::string>& argv, const std::string& cwd) : argv_(argv), cwd_(cwd) {}

  HostOptions parse() {
    std::size_t i = argv_.empty() ? 0 : 1;  // argv[0] is the program name
    for (; i < argv_.size(); ++i) {
      const std::string& arg = argv_[i];
      if (arg == "--") {
        options_.entry.args.assign(argv_.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv_.end());
        script_args_given_ = i + 1 < argv_.size();
        break;
      }
      if (arg.size() > 1 && arg[0] == '-') {
        i = flag(i);
      } else {
        positional(arg);
      }
    }
    finish();
    return std::move(options_);
  }

 private:
  // Handles the flag at argv_[i]; returns the index of the last token it used.
  std::size_t flag(std::size_t i) {
    const std::string& arg = argv_[i];
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    } else if (arg.size() > 2) {
      // `-n4`, `-n=4`, `-mpkg.train`, as Python and most tools accept.
      name = arg.substr(0, 2);
      inline_value = arg.substr(arg[2] == '=' ? 3 : 2);
    }

    const FlagSpec* spec = find_flag(name);
    if (!spec || (!spec->takes_value && inline_value && name.size() == 2)) unknown_flag(arg);
    if (!spec->takes_value && inline_value) {
      throw ConfigError(name + " takes no value, got " + single_quoted(arg) + "; write " + name +
                        " alone");
    }

    std::string value;
    if (spec->takes_value) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < argv_.size() && argv_[i + 1] != "--" && argv_[i + 1].rfind("--", 0) != 0) {
        value = argv_[++i];
      } else {
        const std::string what = spec->id == FlagId::module ? "a module name" : "a value";
        throw ConfigError(name + " needs " + what + ", e.g. " + name + " " + spec->example);
      }
    }
    apply(*spec, name, value);
    return i;
  }

  [[noreturn]] void unknown_flag(const std::string& arg) const {
    const std::string name = arg.substr(0, arg.find('='));
    std::string hint;
    if (auto near = closest_name(name, long_flag_names())) hint = " (did you mean '" + *near + "'?)";
    if (target_seen_)
      throw ConfigError("unknown flag " + single_quoted(arg) + hint + "; " + std::string(kScriptArgsHint));
    throw ConfigError("unknown flag " + single_quoted(arg) + hint + "; run airhost --help for every flag");
  }

  void apply(const FlagSpec& spec, const std::string& name, const std::string& value) {
    Settings& s = flags_;
    switch (spec.id) {
      case FlagId::accelerators: {
        const auto n = parse_integer(value);
        if (!n || *n <= 0 || *n > INT_MAX) {
          throw ConfigError(name + " must be a positive integer, got " + single_quoted(value) +
                            "; leave it out to start one rank per visible GPU");
        }
        s.accelerators = static_cast<int>(*n);
        break;
      }
      case FlagId::timeout: s.timeout = parse_duration_seconds(value, name); break;
      case FlagId::grace: s.grace = parse_duration(value, name); break;
      case FlagId::hang_timeout:
        if (value == "off") {
          s.hang_timeout = std::chrono::milliseconds(0);
          break;
        }
        try {
          s.hang_timeout = parse_duration(value, name);
        } catch (const ConfigError&) {
          throw ConfigError(name + " must be a duration like 30m, 90s or 1h, or off, got " + single_quoted(value));
        }
        if (s.hang_timeout->count() < 1000)
          throw ConfigError(name + " must be at least 1 second, or off, got " + single_quoted(value) + "; e.g. " +
                            name + " " + spec.example);
        break;
      case FlagId::on_hang:
        if (value != "report" && value != "stop")
          throw ConfigError(name + " must be report (say where each rank is, and go on) or stop (end the run as its "
                            "timeout does, exit 124), got " + single_quoted(value));
        s.stop_on_hang = value == "stop";
        break;
      case FlagId::python: s.python = value; break;
      case FlagId::run_dir: s.run_dir = value; break;
      case FlagId::master_addr:
        if (value.empty())
          throw ConfigError(name + " must not be empty; e.g. " + name + " " + spec.example);
        s.master_addr = value;
        break;
      case FlagId::master_port: {
        const auto n = parse_integer(value);
        if (!n || *n < 0 || *n > 65535) {
          throw ConfigError(name + " must be an integer from 0 to 65535 (0 = a free port), got " +
                            single_quoted(value) + "; e.g. " + name + " " + spec.example);
        }
        s.master_port = static_cast<int>(*n);
        break;
      }
      case FlagId::max_restarts: {
        const auto n = parse_integer(value);
        if (!n || *n < 0 || *n > 1000) {
          throw ConfigError(name + " must be an integer from 0 to 1000, got " + single_quoted(value) + "; e.g. " +
                            name + " " + spec.example);
        }
        s.max_restarts = static_cast<int>(*n);
        break;
      }
      case FlagId::nnodes: {
        const auto range = parse_node_count(value);
        if (!range)
          throw ConfigError(name + " must be a positive integer (the number of nodes), or MIN:MAX for an elastic job "
                            "(1 <= MIN <= MAX), got " + single_quoted(value) + "; e.g. " + name + " " + spec.example +
                            " or " + name + " 2:4");
        s.nnodes = range->second;
        s.nnodes_min = range->first != range->second ? std::optional<int>(range->first) : std::nullopt;
        break;
      }
      case FlagId::join_settle:
      case FlagId::scale_up_interval: {
        const auto d = parse_duration(value, name);
        if (d.count() < 0) throw ConfigError(name + " must not be negative; e.g. " + name + " " + spec.example);
        (spec.id == FlagId::join_settle ? s.join_settle : s.scale_up_interval) = d;
        break;
      }
      case FlagId::node_rank: {
        const auto n = parse_integer(value);
        if (!n || *n < 0 || *n > INT_MAX)
          throw ConfigError(name + " must be a non-negative integer (0 for the node at --master-addr), got " +
                            single_quoted(value) + "; e.g. " + name + " " + spec.example);
        s.node_rank = static_cast<int>(*n);
        break;
      }
      case FlagId::node_timeout:
      case FlagId::join_timeout: {
        const auto d = parse_duration_seconds(value, name);
        if (d.count() < 1)
          throw ConfigError(name + " must be at least 1 second, got " + single_quoted(value) + "; e.g. " + name + " " +
                            spec.example);
        (spec.id == FlagId::node_timeout ? s.node_timeout : s.join_timeout) = d;
        break;
      }
      case FlagId::join_token_file:
        if (value.empty())
          throw ConfigError(name + " needs a file holding the job's join token; e.g. " + name + " " + spec.example);
        s.join_token_file = value;
        break;
      case FlagId::prefix: s.prefix = true; break;
      case FlagId::no_prefix: s.prefix = false; break;
      case FlagId::ranks: s.ranks = parse_ranks(name, value); break;
      case FlagId::env: {
        const auto eq = value.find('=');
        if (eq == std::string::npos || eq == 0) {
          throw ConfigError(name + " must be KEY=VALUE with a non-empty KEY, got " + single_quoted(value) +
                            "; e.g. " + name + " " + spec.example);
        }
        s.env[value.substr(0, eq)] = value.substr(eq + 1);
        break;
      }
      case FlagId::config:
        if (value.empty())
          throw ConfigError(name + " must name a file; e.g. " + name + " " + spec.example);
        config_flag_ = value;
        break;
      case FlagId::preflight: s.preflight = true; break;
      case FlagId::tracking: s.tracking = true; break;
      case FlagId::no_tracking: s.tracking = false; break;
      case FlagId::log_max_size: {
        const std::uint64_t bytes = parse_size(value, name);
        if (bytes != 0 && bytes < 4096)
          throw ConfigError(name + " must be 0 (no bound) or at least 4K, got '" + value + "'; e.g. " + name + " 100M");
        s.log_max_bytes = bytes;
        break;
      }
      case FlagId::experiment:
        if (value.empty()) throw ConfigError(name + " must name an MLflow experiment; e.g. " + name + " " + spec.example);
        s.experiment = value;
        break;
      case FlagId::json: options_.json = true; break;
      case FlagId::preload:
        if (value.empty()) throw ConfigError("--preload needs module names, e.g. --preload torch,numpy (or none)");
        s.preload = value;
        break;
      case FlagId::cold: s.warm = false; break;
      case FlagId::print_env: options_.print_env = true; break;
      case FlagId::module: {
        if (doctor_) throw ConfigError("airhost doctor takes no target, got " + single_quoted("-m " + value) + "; run airhost doctor alone");
        const std::string shown = "-m " + value;
        if (target_seen_) two_targets(shown);
        options_.entry = module_entry(value);
        options_.module_target = true;
        target_seen_ = true;
        target_shown_ = shown;
        break;
      }
      case FlagId::pickled: {
        // A cloudpickled (fn, args, kwargs) as the Python API writes it: how a job of a
        // @distributed function (train.job(...).submit()) runs through `airhost submit`.
        if (doctor_) throw ConfigError("airhost doctor takes no target, got " + single_quoted("--pickled " + value) + "; run airhost doctor alone");
        const std::string shown = "--pickled " + value;
        if (target_seen_) two_targets(shown);
        if (value.empty()) throw ConfigError("--pickled must name a payload file written by the Python API");
        options_.entry = Entry{};
        options_.entry.kind = Entry::Kind::pickled;
        options_.entry.target = value;
        options_.module_target = false;
        target_seen_ = true;
        target_shown_ = shown;
        break;
      }
      case FlagId::help:
      case FlagId::version:
        break;  // handled before parsing: see parse_command_line
    }
  }

  static std::set<int> parse_ranks(const std::string& name, const std::string& value) {
    const auto bad = [&] {
      return ConfigError(name + " must be a comma-separated list of rank numbers or 'all', got " +
                         single_quoted(value) + "; e.g. " + name + " 0,2,3");
    };
    std::set<int> ranks;
    if (value == "all") return ranks;  // lets a flag undo a config file's filter
    std::string_view rest = value;
    while (true) {
      const auto comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      const auto n = parse_integer(item);
      if (!n || *n < 0 || *n > INT_MAX) throw bad();
      ranks.insert(static_cast<int>(*n));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    return ranks;
  }

  [[noreturn]] void two_targets(const std::string& second) const {
    throw ConfigError("two targets given, " + single_quoted(target_shown_) + " and " + single_quoted(second) +
                      "; run one target, and put script arguments after `--`, e.g. airhost " +
                      target_shown_ + " -- " + second);
  }

  void positional(const std::string& arg) {
    if (arg.empty()) throw ConfigError("the target is an empty string; give a script path, e.g. airhost train.py");
    if (arg == "-") {
      throw ConfigError("airhost cannot read a script from standard input ('-'); save it to a file and give its path");
    }
    if (doctor_) throw ConfigError("airhost doctor takes no target, got " + single_quoted(arg) + "; run airhost doctor alone");
    if (warm_ && options_.warm_action.empty()) {
      if (arg != "start" && arg != "stop" && arg != "status")
        throw ConfigError("airhost warm takes start, stop or status, got " + single_quoted(arg));
      options_.warm_action = arg;
      return;
    }
    if (warm_) throw ConfigError("airhost warm " + options_.warm_action + " takes nothing more, got " + single_quoted(arg));
    if (target_seen_) two_targets(arg);
    if (arg == "warm" && !doctor_) {
      warm_ = true;
      return;
    }
    if (arg == "doctor") {
      doctor_ = true;
      return;
    }
    options_.entry = script_entry(arg);
    options_.module_target = false;
    target_seen_ = true;
    target_shown_ = arg;
  }

  void finish() {
    if (options_.print_env && (warm_ || doctor_))
      throw ConfigError("--print-env describes a launch; drop it, or run airhost --print-env [train.py]");
    if (warm_) {
      options_.command = Command::warm;
      if (options_.warm_action.empty()) throw ConfigError("airhost warm needs start, stop or status");
    } else if (doctor_) {
      options_.command = Command::doctor;
      if (script_args_given_) {
        throw ConfigError("airhost doctor takes no script arguments; drop everything after `--`");
      }
    } else {
      options_.command = Command::run;
      if (options_.json) {
        throw ConfigError("--json only applies to airhost doctor; drop it, or run airhost doctor --json");
      }
      if (!target_seen_ && !options_.print_env) {
        throw ConfigError(
            "nothing to run: give a script (airhost train.py), a module (airhost -m pkg.train) "
            "or a subcommand (airhost doctor); see airhost --help");
      }
    }

    namespace fs = std::filesystem;
    std::string path;
    if (config_flag_) {
      fs::path p(*config_flag_);
      path = p.is_relative() && !cwd_.empty() ? (fs::path(cwd_) / p).string() : p.string();
    } else {
      const fs::path implicit = fs::path(cwd_) / "airhost.toml";
      std::error_code ec;
      if (fs::exists(implicit, ec)) path = implicit.string();
    }
    if (!path.empty()) {
      options_.settings = load_config_file(path);
      options_.config_path = path;
    }
    options_.settings.merge(flags_);
    options_.flags = flags_;
  }

  const std::vector<std::string>& argv_;
  const std::string& cwd_;
  HostOptions options_;
  Settings flags_;
  std::optional<std::string> config_flag_;
  bool doctor_ = false;
  bool warm_ = false;
  bool target_seen_ = false;
  std::string target_shown_;  // as typed, for messages
  bool script_args_given_ = false;
};

}  // namespace

HostOptions parse_command_line(const std::vector<std::string>& argv, const std::string& cwd) {
  // Help and version answer even a command line that is wrong otherwise, and read no config.
  for (std::size_t i = 1; i < argv.size() && argv[i] != "--"; ++i) {
    const std::string& arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "-V" || arg == "--version") {
      HostOptions options;
      options.command = (arg == "-h" || arg == "--help") ? Command::help : Command::version;
      return options;
    }
  }
  return Parser(argv, cwd).parse();
}

std::string usage_text() {
  return R"(usage: airhost [flags] SCRIPT.py [flags] [-- script args]
       airhost [flags] SCRIPT.py:FUNCTION [flags] [-- script args]
       airhost [flags] -m MODULE[:FUNCTION] [flags] [-- script args]
       airhost doctor [--json]
       airhost warm start [--preload M,M] | stop | status
       airhost submit [--to local|slurm] [--watch] [--dry-run] [--nodes N] [--requeue] [slurm flags] LAUNCH
       airhost runs [--json] | runs show ID [--json] | runs keep ID [--undo]
       airhost runs prune [--older-than 7d] [--keep N] [--max-size 20G] [--dry-run]
       airhost logs ID [--node K] [--rank R] [--follow] [--tail N]
       airhost cancel ID
       airhost stacks [ID] [--json] [--all-threads] [--sample DURATION]

Runs a Python (PyTorch) program on N ranks of this node, like torchrun: one process per
rank, each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Output is
forwarded line by line; every rank's full log is kept in the run directory.

Targets:
  train.py              run the file as __main__ on every rank (like python train.py)
  train.py:main         import the file and call main() on every rank
  -m pkg.train          run the module as __main__ (like python -m pkg.train)
  -m pkg.train:main     import the module and call main()
  --pickled FILE        call a cloudpickled function, as the Python API writes it (its jobs:
                        fn.job(...).submit() runs airhost submit --pickled)
  Everything after the first `--` is passed to the script as sys.argv[1:]; flags may
  come before or after the target.

Jobs and runs (docs/jobs.md): every launch keeps a run directory with run.json and its logs.
  submit LAUNCH         start LAUNCH (what airhost takes: a script, its flags, -- its args)
                        past this terminal: --to local (default without sbatch on PATH) runs
                        it detached on this node; --to slurm (default with sbatch) writes a
                        batch script, one airhost per node, and submits it. Prints the run id.
                        --watch follows it and exits with its code (Ctrl-C stops watching
                        only); --dry-run prints what it would submit; --nodes N (Slurm);
                        --partition --account --qos --time --gpus-per-node --cpus-per-task
                        --mem --constraint --sbatch OPTION over the config's [slurm] table
  runs                  the runs, newest first: id, state, nodes x ranks, start, duration,
                        exit code, entry, scheduler job id (--json: as JSON)
  runs show ID          one run: each rank, the root cause with its traceback, log paths
  logs ID               a run's rank logs (--rank R, --node K, --tail N; --follow until the
                        run ends)
  cancel ID             stop a running run (SIGTERM to its airhost, which stops its ranks)
  stacks [ID]           every rank's Python stacks, ranks standing in the same place shown
                        once, the odd ones out first (default: your newest live run; the
                        main thread and threads not idle, --all-threads for every one;
                        --json as data). Ctrl-\ on a running airhost prints them too;
                        --sample 10s: where each rank spends its time over 10 s, and its CPU
  ID is a run id, a unique prefix of one, or latest.

Flags:
  -n, --accelerators N  ranks to start (also --nproc-per-node, --nproc_per_node);
                        default: one per visible GPU, or 1 without GPUs
  --timeout D           limit for the whole run, in seconds or as 90s, 15m, 3h, 1h30m;
                        0 = none (default: 3h)
  --grace D             on teardown, wait this long between SIGTERM and SIGKILL
                        (default: 10s)
  --hang-timeout D      no rank making progress this long is a hang: say where each rank
                        is, stacks in the run directory (default: 30m; off)
  --on-hang report|stop a hang is reported and the run goes on (report, the default), or
                        it ends the run as its timeout does, exit 124 (stop)
  --python P            interpreter whose environment the ranks use
                        (default: the one airhost was installed into)
  --run-dir D           directory for this run's logs and records (default:
                        $AIRHOST_RUNS_DIR/<run id>, else
                        ${XDG_STATE_HOME:-~/.local/state}/airhost/runs/<run id>)
  --master-addr A       MASTER_ADDR given to the ranks (default: 127.0.0.1); under
                        Slurm or Kubernetes, the job's first node
  --master-port P       MASTER_PORT given to the ranks, 0..65535
                        (default: 0 = a free port reserved for the run, or the port
                        Slurm or Kubernetes give for a multi-node job)
  --max-restarts N      after a rank fails, stop every rank and start the group again,
                        up to N times, on every node together; ranks see
                        TORCHELASTIC_RESTART_COUNT (default: 0)
  --nnodes N            nodes in the job, each running this command with the same flags
                        but its own --node-rank; RANK = node rank x ranks per node + local
                        rank, WORLD_SIZE = N x ranks per node (default: 1)
  --nnodes MIN:MAX      an elastic job: it starts once MIN nodes joined and no other came
                        for --join-settle (at once when MAX joined); node 0 numbers the
                        nodes without gaps, and the others may leave out --node-rank
  --node-rank R         this node's rank, 0..N-1 (also --node_rank); node 0 is the one at
                        --master-addr (default: 0)
                        With N > 1, --master-port is required: node 0's airhost listens
                        there until every node has joined and agreed (same N, same ranks
                        per node), then rank 0's store takes the port
  --node-timeout D      several nodes: another node silent this long is lost and this
                        node's ranks are stopped, exit 138; a node whose airhost exits or is
                        killed is lost at once (default: 30s)
  --join-timeout D      several nodes: how long every node may take to join, and a lost node
                        to come back (default: 10m)
  --join-settle D       elastic: once MIN nodes joined, how long no newcomer must come before
                        the job starts (default: 3s)
  --scale-up-interval D elastic: a node that comes while the job runs is taken in by a
                        restart of every node, at most once per D (default: 1m)
  --prefix              put "[rank N] " before each output line (the default)
  --no-prefix           forward output lines as they are
  --ranks LIST          show only these ranks' output, e.g. 0,2,3; 'all' shows every
                        rank (default: all); the log files are always complete
  --env KEY=VALUE       extra environment variable for every rank (repeatable)
  --no-tracking         do not create an MLflow run for this launch (by default one is
                        created when the ranks' interpreter can import mlflow)
  --tracking            create it (the default; overrides tracking = false in a file)
  --experiment NAME     the MLflow experiment of that run (default: MLFLOW_EXPERIMENT_NAME,
                        else "airhost")
  --log-max-size SIZE   bound each rank log (e.g. 100M): its first and last halves are kept,
                        the middle cut and said so (default: no bound)
  --preflight           check the node (GPUs, interpreter) before starting any rank
                        (default: off)
  --preload M,M         modules the warm server imports before forking ranks; with a
                        run, the warm server to use must have exactly these (default:
                        auto = torch if installed; none = nothing)
  --cold                start the ranks cold even when a warm server is running
  --config FILE         read settings from FILE (default: ./airhost.toml if it exists)
  --print-env           print where this node's place in the job comes from (flags,
                        config file, Slurm, Kubernetes, defaults) and the environment
                        each local rank would get, then exit 0 without starting anything
  --json                airhost doctor only: print the report as JSON
  -h, --help            print this help and exit
  -V, --version         print the version and exit
  Every flag taking a value accepts both --flag VALUE and --flag=VALUE.

Config file:
  airhost reads --config FILE, else airhost.toml in the current directory if there is
  one. Flags override the file, and the file overrides the defaults. configs/default.toml
  documents every key with its default; unknown keys are errors.

Slurm and Kubernetes:
  Under srun (one airhost per node) or in a Kubeflow PyTorchJob pod, the node count, node
  rank, master address and port and the ranks per node are taken from the job's
  environment when no flag or config key gives them (docs/multinode.md: "Slurm and Kubernetes");
  AIRHOST_DETECT=0 turns that off. --print-env shows what was found.

Exit status:
  0        every rank exited 0
  N        the code of the first rank that failed, or 128+SIG if it died of signal SIG
  1        a failure not caused by a rank (e.g. a rank could not be started)
  2        bad command line, config file or launch settings; nothing was started
  3        airhost doctor: no usable GPU on this node
  4        --preflight checks failed, nothing was started; or airhost doctor: a GPU
           check failed (CUDA runtime, NCCL, memory)
  124      the run reached its --timeout
  129      airhost got SIGHUP
  130/143  airhost was interrupted (SIGINT, Ctrl-C) / terminated (SIGTERM)
  138      several nodes: another node failed, was stopped or lost, or did not join; this
           node's ranks were stopped (the failing node exits with its rank's code)
)";
}

}  // namespace airhost::detail
