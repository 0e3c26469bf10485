// embed_demo — launch a Python function on 2 ranks from a C++ program with libairhost.
//
//   embed_demo path/to/train_fn.py [function] [ranks] [times]
//
// With `times` above 1 it launches that many times in a row, quietly, and prints what the
// process holds (memory, descriptors, threads, children) after launch 100 and after the last:
// a program that launches for days must not grow (bench/callers.py).
#include <airhost/airhost.hpp>
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

namespace {

int count_entries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

int children() {
  int n = 0;
  const std::string me = std::to_string(::getpid());
  if (DIR* d = ::opendir("/proc")) {
    while (const dirent* e = ::readdir(d)) {
      std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      std::istringstream rest(line.substr(line.rfind(')') + 2));
      std::string state, ppid;
      rest >> state >> ppid;
      n += ppid == me;
    }
    ::closedir(d);
  }
  return n;
}

void print_footprint(int launches) {
  long pages = 0, rss = 0;
  std::ifstream("/proc/self/statm") >> pages >> rss;
  std::printf("embed_demo | after launch %d: rss_kb=%ld fds=%d threads=%d children=%d\n", launches,
              rss * (::sysconf(_SC_PAGESIZE) / 1024), count_entries("/proc/self/fd") - 1, count_entries("/proc/self/task"),
              children());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SCRIPT.py [FUNCTION] [RANKS]\n", argv[0]);
    return 2;
  }
  airhost::LaunchSpec spec;
  spec.entry.kind = airhost::Entry::Kind::function;
  spec.entry.target = argv[1];
  spec.entry.function = argc > 2 ? argv[2] : "train";
  spec.entry.result_format = "json";  // plain text a C++ program can read
  spec.nprocs = argc > 3 ? std::stoi(argv[3]) : 2;
  const int times = argc > 4 ? std::stoi(argv[4]) : 1;
  spec.timeout = std::chrono::seconds(120);
  spec.rank_binary = AIRHOST_RANK_BINARY;
  spec.output.forward = false;  // our own callback prints instead

  std::mutex print_mutex;
  airhost::Callbacks callbacks;
  callbacks.on_output = [&](int rank, airhost::Stream stream, std::string_view line) {
    std::lock_guard lock(print_mutex);
    std::fprintf(stream == airhost::Stream::out ? stdout : stderr, "embed_demo | rank %d | %.*s\n", rank,
                 static_cast<int>(line.size()), line.data());
  };
  callbacks.on_rank_event = [&](const airhost::RankEvent& e) {
    std::lock_guard lock(print_mutex);
    if (e.kind == airhost::RankEvent::Kind::started) std::printf("embed_demo | rank %d started (pid %d)\n", e.rank, e.pid);
    else std::printf("embed_demo | rank %d exited (code %d, signal %d)\n", e.rank, e.exit_code, e.term_signal);
  };

  if (times > 1) {
    // The same launch again and again, as a long-lived program does; nothing printed per launch.
    callbacks = {};
    for (int i = 1; i <= times; ++i) {
      airhost::Launcher launcher(spec, callbacks);
      const airhost::RunReport report = launcher.run();
      if (!report.ok()) {
        std::fprintf(stderr, "embed_demo: launch %d: %s\n", i, report.message.c_str());
        return report.exit_code;
      }
      if (i == 100 || i == times) print_footprint(i);
    }
    return 0;
  }
  airhost::Launcher launcher(spec, callbacks);
  airhost::RunReport report;
  try {
    report = launcher.run();
  } catch (const airhost::LaunchError& e) {
    std::fprintf(stderr, "embed_demo: %s\n", e.what());
    return airhost::to_int(airhost::ExitCode::usage);
  }
  std::printf("embed_demo | outcome: %s (exit %d) in %.2f s, logs in %s\n", airhost::to_string(report.outcome),
              report.exit_code, report.wall_seconds, report.run_dir.c_str());
  for (const auto& r : report.ranks) {
    if (r.result) std::printf("embed_demo | result of rank %d: %s\n", r.rank, r.result->c_str());
    if (r.error) std::printf("embed_demo | rank %d raised %s: %s\n", r.rank, r.error->type.c_str(), r.error->message.c_str());
  }
  return report.exit_code;
}
