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
#include "launch/run_dir.hpp"

namespace airhost::detail {

namespace {

struct SubmitOptions {
  std::string to;                      // local | slurm; empty = slurm when sbatch is on PATH
  bool watch = false;
  bool dry_run = false;
  int nodes = 1;
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

// Takes submit's own flags out of the arguments before `--`; the rest is the launch.
SubmitOptions parse_submit(const std::vector<std::string>& args) {
  SubmitOptions o;
  bool script_args = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& name, const std::string& example) {
      if (a.size() > name.size() && a[name.size()] == '=') return a.substr(name.size() + 1);
      if (i + 1 >= args.size() || args[i + 1] == "--")
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
    } else if (a == "--watch") {
      o.watch = true;
    } else if (a == "--dry-run") {
      o.dry_run = true;
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

volatile sig_atomic_t g_stop_watching = 0;
void on_watch_signal(int sig) { g_stop_watching = sig; }

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
  struct sigaction sa{};
  sa.sa_handler = on_watch_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  off_t offset = 0;
  while (true) {
    pump(console, offset);
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
    if (o.to == "slurm")
      throw ConfigError(on_path("sbatch") ? "--to slurm is not built yet; submit with --to local, or run airhost under srun"
                                          : "--to slurm needs sbatch on PATH, and there is none; install Slurm's client "
                                            "tools, or submit with --to local");
    return submit_local(o, launch);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "airhost: %s\n", e.what());
    return to_int(ExitCode::usage);
  }
}

}  // namespace airhost::detail
