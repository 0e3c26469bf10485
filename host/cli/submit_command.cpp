// submit_command.cpp — `airhost submit [--to local] [--watch] LAUNCH...`: a run that outlives the
// terminal. The target here is `local`: this node runs the launch detached (a session of its
// own, stdin from /dev/null, its console into the run directory), exactly as `airhost LAUNCH`
// would run it in the foreground, so that the run, its run.json and its exit code are those
// of any launch and `airhost runs`, `logs`, `cancel` work on it unchanged.
//
// The submitter waits only until the launch has passed its checks (the command line, the
// script, the interpreter: see kSubmitReadyFd in commands.hpp), so that bad input is still
// one line and exit 2 here, not a failed run found later; then it prints the run id.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "airhost/exit_code.hpp"
#include "airhost/launch.hpp"
#include "base/errors.hpp"
#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "cli/command_line.hpp"
#include "cli/commands.hpp"
#include "cli/run_records.hpp"
#include "cli/slurm_target.hpp"
#include "launch/link/link_auth.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {

namespace {

struct SubmitOptions {
  std::string to;                      // local | slurm; empty = slurm when sbatch is on PATH
  bool watch = false;
  bool dry_run = false;
  int nodes = 1;
  SlurmSettings slurm;                 // --partition, --time, ... (over the file's [slurm])
  std::vector<std::string> launch;     // everything else: what `airhost LAUNCH...` takes
};

bool on_path(const std::string& program) {
  const std::string path = getenv_or("PATH", "");
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t colon = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, colon - start);
    if (!dir.empty() && is_executable(dir + "/" + program)) return true;
    start = colon + 1;
  }
  return false;
}

struct SlurmFlag {
  const char* name;
  const char* example;
};
constexpr SlurmFlag kSlurmFlags[] = {
    {"--partition", "gpu"}, {"--account", "ml-team"}, {"--qos", "high"}, {"--time", "24:00:00"},
    {"--gpus-per-node", "8"}, {"--cpus-per-task", "64"}, {"--mem", "256G"}, {"--constraint", "h100"},
    {"--sbatch", "--exclusive"}, {"--signal", "USR1@90"},
};

const SlurmFlag* slurm_flag_of(const std::string& arg) {
  for (const auto& f : kSlurmFlags) {
    const std::string name = f.name;
    if (arg == name || arg.rfind(name + "=", 0) == 0) return &f;
  }
  return nullptr;
}

// Takes submit's own flags out of the arguments before `--`; the rest is the launch.
SubmitOptions parse_submit(const std::vector<std::string>& args) {
  SubmitOptions o;
  bool script_args = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& name, const std::string& example) {
      if (a.size() > name.size() && a[name.size()] == '=') return a.substr(name.size() + 1);
      if (i + 1 >= args.size() || (args[i + 1] == "--" && name != "--sbatch"))
        throw ConfigError(name + " needs a value, e.g. " + name + " " + example);
      return args[++i];
    };
    if (script_args || a == "--") {
      script_args = true;
      o.launch.push_back(a);
    } else if (a == "--to" || a.rfind("--to=", 0) == 0) {
      o.to = value("--to", "local");
      if (o.to != "local" && o.to != "slurm")
        throw ConfigError("--to takes local or slurm, got '" + o.to + "'; e.g. --to local");
    } else if (a == "--requeue" || a == "--no-requeue") {
      o.slurm.requeue = a == "--requeue";
    } else if (a == "--watch") {
      o.watch = true;
    } else if (a == "--dry-run") {
      o.dry_run = true;
    } else if (auto slurm_flag = slurm_flag_of(a)) {
      const std::string v = value(slurm_flag->name, slurm_flag->example);
      if (v.empty()) throw ConfigError(std::string(slurm_flag->name) + " must not be empty; e.g. " + slurm_flag->name + " " + slurm_flag->example);
      SlurmSettings& sl = o.slurm;
      const std::string name = slurm_flag->name;
      auto count = [&](int low) {
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (*end || n < low || n > (1 << 20))
          throw ConfigError(name + " must be an integer of at least " + std::to_string(low) + ", got '" + v + "'; e.g. " +
                            name + " " + slurm_flag->example);
        return static_cast<int>(n);
      };
      if (name == "--partition") sl.partition = v;
      else if (name == "--account") sl.account = v;
      else if (name == "--qos") sl.qos = v;
      else if (name == "--time") sl.time = v;
      else if (name == "--gpus-per-node") sl.gpus_per_node = count(0);
      else if (name == "--cpus-per-task") sl.cpus_per_task = count(1);
      else if (name == "--mem") sl.mem = v;
      else if (name == "--constraint") sl.constraint = v;
      else if (name == "--signal") sl.signal = checked_warning_signal(v, "--signal");
      else sl.extra.push_back(v);
    } else if (a == "--nodes" || a.rfind("--nodes=", 0) == 0) {
      const std::string v = value("--nodes", "2");
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 1 || n > 100000)
        throw ConfigError("--nodes must be a positive integer (the number of nodes), got '" + v + "'; e.g. --nodes 2");
      o.nodes = static_cast<int>(n);
    } else {
      o.launch.push_back(a);
    }
  }
  if (o.to.empty()) o.to = on_path("sbatch") ? "slurm" : "local";
  return o;
}

// A pickled function (`--pickled FILE`, from the Python API's job submit) travels with the run:
// FILE is copied into the run directory, which every node of the job sees, and the launch reads
// it from there; a requeued job finds it again. Returns the launch with the path replaced.
std::vector<std::string> stage_payload(const std::vector<std::string>& launch, const HostOptions& parsed,
                                       const std::string& run_dir) {
  if (parsed.entry.kind != Entry::Kind::pickled) return launch;
  const std::string& from = parsed.entry.target;
  const std::string to = run_dir + "/" + std::filesystem::path(from).filename().string();
  std::error_code ec;
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) throw ConfigError("cannot copy the payload " + from + " into " + run_dir + ": " + ec.message());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < launch.size(); ++i) {
    if (launch[i] == "--") {
      out.insert(out.end(), launch.begin() + static_cast<std::ptrdiff_t>(i), launch.end());
      break;
    }
    if (launch[i] == "--pickled" && i + 1 < launch.size()) {
      out.push_back("--pickled");
      out.push_back(to);
      ++i;
    } else if (launch[i].rfind("--pickled=", 0) == 0) {
      out.push_back("--pickled=" + to);
    } else {
      out.push_back(launch[i]);
    }
  }
  return out;
}

// A Slurm job's run directory is read and written by every node of it. A runs root in memory
// (tmpfs: /dev/shm, a /tmp mounted so) is this node's alone: refused before anything is
// submitted. (A local disk cannot be told from a shared one; the nodes check at start.)
void refuse_node_local_runs_root(const std::string& root) {
  std::filesystem::path p = root;
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
  struct statfs fs{};
  if (p.empty() || ::statfs(p.c_str(), &fs) != 0) return;
  constexpr long kTmpfs = 0x01021994, kRamfs = 0x858458f6;
  if (static_cast<long>(fs.f_type) == kTmpfs || static_cast<long>(fs.f_type) == kRamfs)
    throw ConfigError("the runs root " + root + " is in memory (tmpfs) on this node, which the job's nodes do not see; "
                      "a Slurm job keeps its run there for every node: set AIRHOST_RUNS_DIR to a shared file system "
                      "(NFS, Lustre, ...) and submit again");
}

volatile sig_atomic_t g_stop_watching = 0;
volatile sig_atomic_t g_want_stacks = 0;
void on_watch_signal(int sig) { g_stop_watching = sig; }
void on_watch_quit(int) { g_want_stacks = 1; }

// The watch's signals: Ctrl-C, SIGTERM and the terminal closing end the watching (the run goes
// on); Ctrl-\ prints the run's stacks, as it does on a launch, and the watching goes on.
void watch_signals() {
  struct sigaction sa{};
  sa.sa_handler = on_watch_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_watch_quit;
  ::sigaction(SIGQUIT, &sa, nullptr);
}

// Ctrl-\ came: `airhost stacks RUN` (the host answers through its socket), on stderr.
void show_stacks_if_asked(const std::string& run_id) {
  if (!g_want_stacks) return;
  g_want_stacks = 0;
  std::string said;
  run_capture(shell_quote(executable_path()) + " stacks " + shell_quote(run_id) + " 2>&1 </dev/null", said);
  std::fputs(("\n" + said).c_str(), stderr);
}

// Copies what `path` holds past `offset` to stdout.
void pump(const std::string& path, off_t& offset) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::pread(fd.get(), buf, sizeof buf, offset)) > 0) {
    offset += n;
    write_all(STDOUT_FILENO, std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return exit_code_for_signal(WTERMSIG(status));
  return to_int(ExitCode::generic_failure);
}

// --watch: the run's console as it is written, until the host exits; its exit code is the
// run's, by the contract. A signal to the watcher (Ctrl-C, the terminal closing) ends the
// watching only: the run is in a session of its own, and goes on.
int watch(pid_t host, const std::string& run_id, const std::string& console) {
  watch_signals();
  off_t offset = 0;
  while (true) {
    pump(console, offset);
    show_stacks_if_asked(run_id);
    int status = 0;
    const pid_t done = ::waitpid(host, &status, WNOHANG);
    if (done == host) {
      pump(console, offset);
      return exit_code_of(status);
    }
    if (g_stop_watching) {
      std::fprintf(stderr,
                   "\nairhost: stopped watching; run %s goes on (airhost logs %s --follow to watch it again, "
                   "airhost cancel %s to stop it)\n",
                   run_id.c_str(), run_id.c_str(), run_id.c_str());
      return exit_code_for_signal(g_stop_watching);
    }
    ::poll(nullptr, 0, 100);
  }
}

int submit_local(const SubmitOptions& o, const HostOptions& launch) {
  if (o.nodes != 1)
    throw ConfigError("--to local runs on this node only, got --nodes " + std::to_string(o.nodes) +
                      "; drop --nodes, or submit to Slurm (--to slurm) for several nodes");
  const std::string run_id = make_run_id();
  const std::string run_dir = launch.settings.run_dir.value_or(default_runs_root() + "/" + run_id);
  std::vector<std::string> argv = {executable_path()};
  argv.insert(argv.end(), o.launch.begin(), o.launch.end());
  if (o.dry_run) {
    std::string line = std::string(kSubmitRunIdVar) + "=" + run_id;
    for (const auto& a : argv) line += " " + shell_quote(a);
    std::printf("%s </dev/null >%s 2>&1 &  # in a session of its own\n", line.c_str(),
                shell_quote(run_dir + "/console.log").c_str());
    return 0;
  }
  try {
    create_run_dir(run_dir);
  } catch (const std::system_error& e) {
    throw ConfigError(std::string(e.what()) + "; choose another with --run-dir or AIRHOST_RUNS_DIR");
  }
  argv.resize(1);
  {
    const auto staged = stage_payload(o.launch, launch, run_dir);
    argv.insert(argv.end(), staged.begin(), staged.end());
  }
  const std::string console = run_dir + "/console.log";
  UniqueFd out(::open(console.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  int ready[2];
  if (!out || !null || ::pipe2(ready, O_CLOEXEC) != 0)
    throw ConfigError("cannot prepare " + console + ": " + std::strerror(errno));
  UniqueFd ready_read(ready[0]), ready_write(ready[1]);

  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string ready_env = std::string(kSubmitReadyFdVar) + "=" + std::to_string(ready_write.get());
  const std::string id_env = std::string(kSubmitRunIdVar) + "=" + run_id;
  std::fflush(nullptr);
  const pid_t host = ::fork();
  if (host < 0) throw ConfigError(std::string("cannot start the run: ") + std::strerror(errno));
  if (host == 0) {
    // The run's own session: no controlling terminal, so the terminal's hangup, Ctrl-C and
    // job control reach the submitter, never the run.
    ::setsid();
    ::dup2(null.get(), STDIN_FILENO);
    ::dup2(out.get(), STDOUT_FILENO);
    ::dup2(out.get(), STDERR_FILENO);
    ::fcntl(ready_write.get(), F_SETFD, 0);  // the one descriptor the host inherits from here
    ::putenv(const_cast<char*>(ready_env.c_str()));
    ::putenv(const_cast<char*>(id_env.c_str()));
    ::signal(SIGPIPE, SIG_DFL);
    ::execv(cargv[0], cargv.data());
    std::fprintf(stderr, "airhost: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    _exit(127);
  }
  ready_write.reset();
  // One byte once the launch has passed its checks; end of file without it: it refused (one
  // line in the console), or could not start.
  char byte = 0;
  ssize_t n;
  while ((n = ::read(ready_read.get(), &byte, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) {
    int status = 0;
    while (::waitpid(host, &status, 0) < 0 && errno == EINTR) {
    }
    off_t offset = 0;
    ::dup2(STDERR_FILENO, STDOUT_FILENO);  // what it said is an error: to stderr, as a launch's
    pump(console, offset);
    std::error_code ec;
    if (!launch.settings.run_dir) std::filesystem::remove_all(run_dir, ec);  // nothing ran; keep no trace
    return exit_code_of(status);
  }
  std::printf("%s\n", run_id.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "airhost: submitted run %s on this node (pid %d); airhost logs %s --follow, airhost cancel %s\n",
               run_id.c_str(), static_cast<int>(host), run_id.c_str(), run_id.c_str());
  if (!o.watch) return 0;
  std::fprintf(stderr, "airhost: watching run %s; Ctrl-C stops watching, not the run\n", run_id.c_str());
  return watch(host, run_id, console);
}

// The job's run.json, once node 0's host has written it; an ended (or lost) one ends the watch.
// `queued`: whether Slurm still has the job (squeue), for a job that ends before airhost runs.
bool slurm_job_queued(const std::string& job_id) { return slurm_job_active(job_id).value_or(false); }

int watch_slurm(const std::string& run_id, const std::string& run_dir, const std::string& job_id) {
  watch_signals();
  const std::string output = run_dir + "/slurm-" + job_id + ".out";
  off_t offset = 0;
  double gone_since = 0;
  while (true) {
    pump(output, offset);
    show_stacks_if_asked(run_id);
    RunRecord r = read_run_record(run_dir);
    settle(r);
    if (is_ended(r.state) || r.state == "lost") {
      // srun and the batch script may still write a line or two after the host.
      for (int i = 0; i < 10 && slurm_job_queued(job_id); ++i) ::poll(nullptr, 0, 200);
      pump(output, offset);
      if (r.state == "lost") {
        std::fprintf(stderr, "airhost: run %s: %s\n", run_id.c_str(), r.problem.c_str());
        return to_int(ExitCode::generic_failure);
      }
      return r.exit_code.value_or(to_int(ExitCode::generic_failure));
    }
    if (!slurm_job_queued(job_id)) {
      if (gone_since == 0) gone_since = now_seconds();
      if (now_seconds() - gone_since > 5) {  // Slurm is done with it and no host recorded the end
        pump(output, offset);
        std::fprintf(stderr, "airhost: Slurm job %s of run %s ended without airhost recording how (%s)\n",
                     job_id.c_str(), run_id.c_str(), output.c_str());
        return to_int(ExitCode::generic_failure);
      }
    }
    if (g_stop_watching) {
      std::fprintf(stderr,
                   "\nairhost: stopped watching; run %s (Slurm job %s) goes on (airhost logs %s --follow to watch it "
                   "again, airhost cancel %s to stop it)\n",
                   run_id.c_str(), job_id.c_str(), run_id.c_str(), run_id.c_str());
      return exit_code_for_signal(g_stop_watching);
    }
    ::poll(nullptr, 0, 250);
  }
}

int submit_slurm(const SubmitOptions& o, const HostOptions& launch) {
  if (!on_path("sbatch") && !o.dry_run)
    throw ConfigError("--to slurm needs sbatch on PATH, and there is none; install Slurm's client tools, or submit "
                      "with --to local (--dry-run prints the batch script without it)");
  if (launch.settings.run_dir)
    throw ConfigError("--run-dir names one node's directory; a Slurm job keeps its run in the runs root "
                      "(AIRHOST_RUNS_DIR, on a file system every node sees): drop --run-dir");
  // Relative paths are the launch's, as typed here: the script runs where it was submitted.
  if (!launch.module_target && (launch.entry.kind == Entry::Kind::script || launch.entry.kind == Entry::Kind::function)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(launch.entry.target, ec))
      throw ConfigError("script '" + launch.entry.target + "' not found (working directory " + current_directory() +
                        "); check the path");
  }
  BatchJob job;
  job.run_id = make_run_id();
  job.runs_root = default_runs_root();
  refuse_node_local_runs_root(job.runs_root);
  job.run_dir = job.runs_root + "/" + job.run_id;
  job.working_dir = current_directory();
  job.airhost = executable_path();
  job.launch = o.launch;
  job.nodes = o.nodes;
  if (launch.entry.kind == Entry::Kind::pickled && !std::filesystem::is_regular_file(launch.entry.target))
    throw ConfigError("payload file '" + launch.entry.target + "' not found");
  job.slurm = launch.settings.slurm;
  job.slurm.merge(o.slurm);
  const std::string script = render_batch_script(job);
  if (o.dry_run) {
    std::fputs(script.c_str(), stdout);
    return 0;
  }
  try {
    create_run_dir(job.run_dir);
  } catch (const std::system_error& e) {
    throw ConfigError(std::string(e.what()) + "; choose another runs root with AIRHOST_RUNS_DIR");
  }
  const std::string script_path = job.run_dir + "/slurm.sbatch";
  try {
    job.launch = stage_payload(o.launch, launch, job.run_dir);
    if (job.nodes > 1 && !launch.settings.join_token_file) {
      // A fresh secret for this job, readable by this user only, beside its run (requeued,
      // the job joins with it again).
      job.join_token_file = job.run_dir + "/join.token";
      write_file_atomic(job.join_token_file, fresh_nonce() + "\n");
    }
  } catch (const ConfigError&) {
    std::error_code ec;
    std::filesystem::remove_all(job.run_dir, ec);
    throw;
  }
  write_file_atomic(script_path, render_batch_script(job));
  std::string job_id;
  try {
    job_id = sbatch_submit(script_path);
  } catch (const ConfigError&) {
    std::error_code ec;
    std::filesystem::remove_all(job.run_dir, ec);  // nothing was submitted; keep no trace
    throw;
  }
  write_file_atomic(job.run_dir + "/run.json", pending_run_json(job, job_id, now_seconds()));
  std::printf("%s\n", job.run_id.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "airhost: submitted run %s as Slurm job %s (%d node(s)); airhost logs %s --follow, airhost "
               "cancel %s\n", job.run_id.c_str(), job_id.c_str(), job.nodes, job.run_id.c_str(), job.run_id.c_str());
  if (!o.watch) return 0;
  std::fprintf(stderr, "airhost: watching run %s; Ctrl-C stops watching, not the job\n", job.run_id.c_str());
  return watch_slurm(job.run_id, job.run_dir, job_id);
}

}  // namespace

int submit_command(const std::vector<std::string>& args) {
  try {
    const SubmitOptions o = parse_submit(args);
    // What a launch takes is checked as a launch checks it, before anything is submitted.
    std::vector<std::string> argv = {"airhost"};
    argv.insert(argv.end(), o.launch.begin(), o.launch.end());
    const HostOptions launch = parse_command_line(argv, current_directory());
    if (launch.command != Command::run || launch.print_env)
      throw ConfigError("airhost submit takes what a launch takes: a script, script.py:function or -m module, its "
                        "flags and -- its arguments; e.g. airhost submit train.py -n 4 -- --lr 0.1");
    if (o.to == "slurm") return submit_slurm(o, launch);
    return submit_local(o, launch);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "airhost: %s\n", e.what());
    return to_int(ExitCode::usage);
  }
}

}  // namespace airhost::detail
