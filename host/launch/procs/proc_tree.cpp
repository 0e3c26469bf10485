#include "launch/procs/proc_tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "base/files.hpp"

namespace airhost::detail {

bool read_proc_stat(int pid, ProcStat& out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::string text;
  if (!read_file(path, text)) return false;
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
  //  stime cutime cstime priority nice num_threads itrealvalue starttime ...": comm may hold
  //  spaces and parentheses, so the fields are counted from its last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char* p = text.c_str() + close + 2;
  out.pid = pid;
  out.state = *p;
  char* end = nullptr;
  std::uint64_t fields[21] = {};  // fields 4..24 of the man page (ppid .. starttime, vsize, rss)
  p += 1;
  for (int i = 0; i < 21; ++i) {
    fields[i] = std::strtoull(p, &end, 10);
    if (end == p) {
      if (i < 19) return false;
      break;
    }
    p = end;
  }
  out.ppid = static_cast<int>(fields[0]);
  out.pgid = static_cast<int>(fields[1]);
  out.sid = static_cast<int>(fields[2]);
  out.start = fields[18];
  out.cpu = fields[10] + fields[11];
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  out.rss = fields[20] * page;
  return true;
}

std::vector<ProcStat> list_processes() {
  std::vector<ProcStat> all;
  DIR* d = ::opendir("/proc");
  if (!d) return all;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    ProcStat s;
    if (read_proc_stat(std::atoi(e->d_name), s)) all.push_back(s);
  }
  ::closedir(d);
  return all;
}

namespace {

// /proc/<pid>/task/<tid>/children exists (Linux 3.5+ with CONFIG_PROC_CHILDREN, on in every
// distribution's kernel).
bool kernel_lists_children() {
  static const bool listed = ::access("/proc/thread-self/children", R_OK) == 0;
  return listed;
}

// The children of every thread of `pid`, appended to `out` (none when it is gone).
void children_of(int pid, std::vector<int>& out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* d = ::opendir(path);
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::string text;
    if (!read_file(std::string(path) + "/" + e->d_name + "/children", text)) continue;
    for (const char* p = text.c_str(); *p;) {
      char* end = nullptr;
      const long child = std::strtol(p, &end, 10);
      if (end == p) break;
      if (child > 0) out.push_back(static_cast<int>(child));
      p = end;
    }
  }
  ::closedir(d);
}

}  // namespace

std::vector<ProcStat> list_tree(const std::set<int>& pids) {
  if (!kernel_lists_children()) return list_processes();
  std::vector<ProcStat> tree;
  std::set<int> seen;
  std::vector<int> queue(pids.begin(), pids.end());
  while (!queue.empty()) {
    const int pid = queue.back();
    queue.pop_back();
    if (!seen.insert(pid).second) continue;
    ProcStat s;
    if (!read_proc_stat(pid, s)) continue;
    tree.push_back(s);
    children_of(pid, queue);
  }
  return tree;
}

bool takes_signal(int pid, int sig) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", pid);
  std::string status;
  if (!read_file(path, status)) return true;
  const std::uint64_t bit = 1ull << (sig - 1);
  for (const char* field : {"\nSigBlk:\t", "\nSigIgn:\t", "\nSigCgt:\t"}) {
    const auto at = status.find(field);
    if (at == std::string::npos) return true;
    if (std::strtoull(status.c_str() + at + std::strlen(field), nullptr, 16) & bit) return true;
  }
  return false;
}

bool environ_has(int pid, const std::string& entry) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/environ", pid);
  std::string env;
  if (!read_file(path, env)) return false;
  for (std::size_t at = 0; at < env.size();) {
    const std::size_t nul = env.find('\0', at);
    const std::size_t len = (nul == std::string::npos ? env.size() : nul) - at;
    if (len == entry.size() && env.compare(at, len, entry) == 0) return true;
    if (nul == std::string::npos) break;
    at = nul + 1;
  }
  return false;
}

std::vector<ProcStat> match_run(const std::vector<ProcStat>& all, const RunMatch& match) {
  std::map<int, std::vector<const ProcStat*>> children;
  std::map<int, const ProcStat*> by_pid;
  for (const auto& p : all) {
    children[p.ppid].push_back(&p);
    by_pid[p.pid] = &p;
  }
  std::deque<const ProcStat*> queue;
  for (int pid : match.roots)
    if (auto it = by_pid.find(pid); it != by_pid.end()) queue.push_back(it->second);
  for (const auto& [pid, start] : match.known)
    if (auto it = by_pid.find(pid); it != by_pid.end() && it->second->start == start) queue.push_back(it->second);
  if (!match.env_entry.empty())
    for (const auto& p : all)
      if (p.state != 'Z' && !match.exclude.count(p.pid) && environ_has(p.pid, match.env_entry)) queue.push_back(&p);

  std::set<int> seen;
  std::vector<ProcStat> found;
  while (!queue.empty()) {
    const ProcStat* p = queue.front();
    queue.pop_front();
    if (match.exclude.count(p->pid) || !seen.insert(p->pid).second) continue;
    if (p->state != 'Z' && p->state != 'X') found.push_back(*p);
    if (auto it = children.find(p->pid); it != children.end())
      for (const ProcStat* c : it->second) queue.push_back(c);
  }
  return found;
}

int signal_run(const RunMatch& match, int sig) {
  int n = 0;
  for (const auto& p : match_run(list_processes(), match)) n += ::kill(p.pid, sig) == 0;
  return n;
}

std::map<int, std::uint64_t> kill_run(const RunMatch& match) {
  std::map<int, std::uint64_t> stopped;
  RunMatch m = match;
  // Bounded: a fork bomb could otherwise keep us here; 64 rounds of "stop what is new" end
  // any ordinary tree, and whatever was stopped is killed below either way.
  for (int round = 0; round < 64; ++round) {
    bool fresh = false;
    for (const auto& p : match_run(list_processes(), m)) {
      if (stopped.count(p.pid)) continue;
      if (::kill(p.pid, SIGSTOP) == 0) {
        stopped[p.pid] = p.start;
        m.known[p.pid] = p.start;  // what it forks before the stop lands is found below it
        fresh = true;
      }
    }
    if (!fresh) break;
  }
  for (const auto& [pid, start] : stopped) {
    ProcStat now;
    // The same process still (a stopped process does not exit by itself, but another
    // could have killed it and its pid been reused meanwhile).
    if (read_proc_stat(pid, now) && now.start == start) ::kill(pid, SIGKILL);
  }
  return stopped;
}

}  // namespace airhost::detail
