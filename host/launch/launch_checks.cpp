// launch_checks.cpp — see launch_checks.hpp.
#include "launch/launch_checks.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "airhost/airhost.hpp"
#include "launch/link/link_join.hpp"
#include "launch/link/link_wire.hpp"
#include "launch/rank/rank_env.hpp"
#include "launch/rank/warm_starter.hpp"
#include "launch/run/run_dir.hpp"
#include "base/built_for.hpp"
#include "base/util.hpp"

namespace airhost::detail {
namespace {

// The rank runtime embeds the libpython it was built with; an interpreter of another
// version would hand it a standard library it cannot run.
std::string python_version_of(const std::string& python) {
  std::string out;
  run_capture(shell_quote(python) +
                          " -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null",
                      out);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace

std::string entry_kind(const Entry& e) {
  switch (e.kind) {
    case Entry::Kind::script: return "script";
    case Entry::Kind::module: return "module";
    case Entry::Kind::function:
      return e.module_target ? "function-module" : "function-script";
    case Entry::Kind::pickled: return "pickled";
  }
  return "script";
}


// Descriptors a launch holds per rank: its stdout, stderr and control channel, and while it
// starts the child's three ends (a warm start also keeps a copy of its stderr).
constexpr long kFdsPerRank = 7;
// What the host opens besides (libuv's loop, the guard, logs being written, the node link,
// the warm server's socket), with room for the caller's own (a notebook's kernel).
constexpr long kFdsReserve = 64;

// Node 0 of several holds one connection per other node (the node link's star), and one more
// while a lost node comes back.
constexpr long kFdsPerPeer = 1;

// Raises this process's soft limit on open files when `nprocs` ranks (and, on node 0, the
// connections of `peers` other nodes) need more than it allows (within the hard limit, as
// torchrun's users do by hand); throws LaunchError, before anything starts, when even the hard
// limit is too low. Counting what is already open covers a caller that holds many descriptors
// itself.
void ensure_descriptors_for(int nprocs, int peers) {
  long open_now = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++open_now;
  const long needed = open_now + kFdsReserve + kFdsPerRank * nprocs + kFdsPerPeer * (peers > 0 ? peers + 1 : 0);
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY ||
      static_cast<long>(lim.rlim_cur) >= needed)
    return;
  if (lim.rlim_max == RLIM_INFINITY || static_cast<long>(lim.rlim_max) >= needed) {
    lim.rlim_cur = static_cast<rlim_t>(needed);
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) return;
  }
  const std::string who = std::to_string(nprocs) + " rank(s)" +
                          (peers > 0 ? " and the connections of " + std::to_string(peers) + " other node(s)" : "");
  throw LaunchError(who + " need about " + std::to_string(needed) +
                    " open files, but this process may open " + std::to_string(lim.rlim_cur) + " (ulimit -n; hard limit " +
                    (lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max)) +
                    "): raise it (ulimit -n " + std::to_string(std::max<long>(4096, needed)) + ") or start fewer " +
                    (peers > 0 ? "nodes or ranks" : "ranks"));
}

// What to do about an error of the system that stopped an attempt from starting.
std::string resource_hint(const std::exception& e) {
  const auto* se = dynamic_cast<const std::system_error*>(&e);
  if (!se || se->code().category() != std::generic_category()) return "";
  switch (se->code().value()) {
    case EMFILE:
      return " (this process used up its open files: raise ulimit -n, or see what holds them in /proc/" +
             std::to_string(::getpid()) + "/fd)";
    case ENFILE:
      return " (the machine ran out of open files: fs.file-max)";
    case ENOMEM:
    case EAGAIN:
      return " (the machine is out of memory or processes)";
    default:
      return "";
  }
}

void validate(const LaunchSpec& spec, const std::string& rank_binary) {
  auto fail = [](const std::string& s) { throw LaunchError(s); };
  if (spec.nprocs < 1) fail("the number of ranks must be at least 1, got " + std::to_string(spec.nprocs));
  if (spec.nnodes < 1) fail("the number of nodes must be at least 1, got --nnodes " + std::to_string(spec.nnodes));
  if (spec.nnodes_min < 0 || spec.nnodes_min > spec.nnodes)
    fail("--nnodes " + std::to_string(spec.nnodes_min) + ":" + std::to_string(spec.nnodes) +
         " is no range: give --nnodes MIN:MAX with 1 <= MIN <= MAX");
  // An elastic job's nodes but node 0 may leave their rank to node 0 (-1).
  if (spec.node_rank == -1 && spec.nnodes_min == 0)
    fail("this node has no --node-rank: give each node of a --nnodes " + std::to_string(spec.nnodes) +
         " job its own, 0 for the one at --master-addr (only an elastic job, --nnodes MIN:MAX, numbers its nodes itself)");
  if (spec.node_rank < -1 || spec.node_rank >= spec.nnodes)
    fail("--node-rank " + std::to_string(spec.node_rank) + " is out of range for --nnodes " +
         std::to_string(spec.nnodes) + ": node ranks go from 0 to " + std::to_string(spec.nnodes - 1));
  if (spec.nnodes > 1) {
    if (spec.master_port == 0)
      fail("with --nnodes " + std::to_string(spec.nnodes) + ", give --master-port: every node must be given the "
           "same port, where node 0 listens (e.g. --master-port 29500)");
    if (spec.node_timeout.count() < 1) fail("node_timeout must be at least 1 second");
    if (spec.join_timeout.count() < 1) fail("join_timeout must be at least 1 second");
    if (auto problem = resolve_problem(spec.master_addr); !problem.empty())
      fail("master address '" + spec.master_addr + "' does not resolve (" + problem +
           "); give node 0's host name or IP address with --master-addr");
  }
  if (spec.timeout.count() < 0) fail("the timeout cannot be negative (use 0 to disable it)");
  if (spec.grace.count() < 0) fail("the grace period cannot be negative");
  if (spec.master_port < 0 || spec.master_port > 65535)
    fail("master_port must be in 0..65535, got " + std::to_string(spec.master_port));
  if (spec.entry.target.empty() && spec.entry.kind != Entry::Kind::pickled)
    fail("nothing to run: give a script, `script.py:function` or `-m module`");
  if (spec.entry.kind == Entry::Kind::pickled && !spec.entry.target.empty() && !spec.entry.payload.empty())
    fail("a pickled entry takes its payload either inline or from a file (target), not both");
  if (spec.entry.kind == Entry::Kind::pickled && !spec.entry.target.empty() && !is_file(spec.entry.target))
    fail("payload file '" + spec.entry.target + "' not found");
  const bool is_path = spec.entry.kind == Entry::Kind::script ||
                       (spec.entry.kind == Entry::Kind::function && entry_kind(spec.entry) == "function-script");
  if (is_path) {
    std::string path = spec.entry.target;
    if (!path.starts_with("/") && !spec.working_dir.empty()) path = spec.working_dir + "/" + path;
    if (!is_file(path))
      fail("script '" + spec.entry.target + "' not found (working directory " +
           (spec.working_dir.empty() ? current_directory() : spec.working_dir) +
           "); check the path");
  }
  for (int r : spec.output.ranks)
    if (r < 0 || r >= spec.nprocs * spec.nnodes)
      fail("the output filter names rank " + std::to_string(r) + ", but the run has ranks 0.." +
           std::to_string(spec.nprocs * spec.nnodes - 1) + "; fix --ranks");
  if (spec.entry.result_format != "pickle" && spec.entry.result_format != "json")
    fail("result_format must be \"pickle\" or \"json\", got \"" + spec.entry.result_format + "\"");
  if (spec.entry.kind == Entry::Kind::function && spec.entry.function.empty())
    fail("no function named after ':' in '" + spec.entry.target + ":'");
  if (!is_executable(rank_binary))
    fail("the rank runtime '" + rank_binary + "' is missing or not executable; reinstall airhost, "
         "or point AIRHOST_RANK_BINARY at airhost-rank");
  if (!spec.python.empty() && !is_executable(spec.python))
    fail("python interpreter '" + spec.python + "' is not an executable file; give the path of a python "
         "binary (or a venv's bin/python)");
  if (!spec.python.empty() && spec.python != default_python()) {
    const std::string v = python_version_of(spec.python);
    const std::string built = built_python_version();
    if (v != built)
      fail("python interpreter '" + spec.python + "' is Python " + (v.empty() ? "of an unknown version" : v) +
           ", but this airhost was built for Python " + built + "; use a " + built +
           " interpreter or venv, or install airhost with that Python");
  }
}


}  // namespace airhost::detail
