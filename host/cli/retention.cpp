// retention.cpp — see retention.hpp.
#include "cli/retention.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "airhost/exit_code.hpp"
#include "airhost/launch.hpp"
#include "base/errors.hpp"
#include "base/util.hpp"
#include "cli/config.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {

using airhost::default_runs_root;

namespace {

constexpr const char* kKeepFile = "keep";

std::string duration_words(double seconds) {
  if (seconds >= 86400 && std::fmod(seconds, 86400) == 0) return std::to_string(static_cast<long>(seconds / 86400)) + "d";
  if (seconds >= 3600 && std::fmod(seconds, 3600) == 0) return std::to_string(static_cast<long>(seconds / 3600)) + "h";
  return duration_text(seconds);
}

// Walks `fd` (a directory), adding what its files take on disk.
std::uint64_t walk(int fd, int depth) {
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return 0;
  }
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st{};
    if (::fstatat(::dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    total += static_cast<std::uint64_t>(st.st_blocks) * 512;
    if (S_ISDIR(st.st_mode) && depth < 16) {
      const int sub = ::openat(::dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) total += walk(sub, depth + 1);
    }
  }
  ::closedir(d);
  return total;
}

// A run that may go: it has ended, or its host is gone without saying how.
bool removable(const RunRecord& r) { return is_ended(r.state) || r.state == "lost"; }

}  // namespace

RetentionPolicy default_retention() {
  RetentionPolicy p;
  p.older_than_seconds = 30.0 * 86400;
  p.keep = 1000;
  p.max_bytes = std::uint64_t{20} << 30;
  return p;
}

std::uint64_t parse_size(const std::string& text, const std::string& what) {
  const auto bad = [&] {
    return ConfigError(what + " must be a size such as 20G, 512M or 1.5T (K, M, G, T: powers of 1024), got '" + text +
                       "'");
  };
  if (text.empty()) throw bad();
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b') && unit.size() > 1) unit.pop_back();  // "20GB"
  double scale = 1;
  if (unit.empty() || unit == "B" || unit == "b") scale = 1;
  else if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else throw bad();
  if (!std::isfinite(value) || value < 0) throw bad();
  return static_cast<std::uint64_t>(value * scale);
}

RetentionPolicy parse_retention(const std::string& text, const std::string& what) {
  RetentionPolicy p;
  if (text == "off") return p;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      throw ConfigError(what + " takes off, or older_than=DURATION,keep=N,max_size=SIZE (any of them), got '" + text +
                        "'; e.g. older_than=7d,keep=100,max_size=5G");
    if (key == "older_than") {
      p.older_than_seconds = static_cast<double>(parse_duration_seconds(value, what + " older_than").count());
    } else if (key == "keep") {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (*end || n < 0) throw ConfigError(what + " keep must be a count of runs, got '" + value + "'; e.g. keep=100");
      p.keep = n;
    } else if (key == "max_size") {
      p.max_bytes = parse_size(value, what + " max_size");
    } else {
      throw ConfigError(what + " has no '" + key + "'; it takes older_than, keep and max_size, e.g. "
                        "older_than=7d,keep=100,max_size=5G (or off)");
    }
  }
  if (!p.any()) throw ConfigError(what + " is empty; give off, or e.g. older_than=7d,keep=100,max_size=5G");
  return p;
}

std::vector<PruneVictim> plan_prune(const std::vector<PruneCandidate>& runs, const RetentionPolicy& policy, double now) {
  std::set<std::size_t> chosen;
  std::vector<std::string> why(runs.size());
  auto take = [&](std::size_t i, const std::string& reason) {
    if (runs[i].kept || runs[i].job_alive || !removable(*runs[i].run) || chosen.count(i)) return false;
    chosen.insert(i);
    why[i] = reason;
    return true;
  };
  if (policy.older_than_seconds) {
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const RunRecord& r = *runs[i].run;
      const double at = r.ended_at > 0 ? r.ended_at : r.started_at;
      if (at > 0 && now - at > *policy.older_than_seconds) take(i, "older than " + duration_words(*policy.older_than_seconds));
    }
  }
  if (policy.keep) {
    // The newest `keep` runs stay, live ones and kept ones counted among them.
    for (std::size_t i = static_cast<std::size_t>(std::max(0L, *policy.keep)); i < runs.size(); ++i)
      take(i, "beyond the newest " + std::to_string(*policy.keep) + " runs");
  }
  if (policy.max_bytes) {
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < runs.size(); ++i)
      if (!chosen.count(i)) total += runs[i].bytes;
    for (std::size_t i = runs.size(); i-- > 0 && total > *policy.max_bytes;)  // oldest first
      if (take(i, "over " + bytes_text(static_cast<double>(*policy.max_bytes)) + " in all")) total -= runs[i].bytes;
  }
  std::vector<PruneVictim> out;
  for (std::size_t i = runs.size(); i-- > 0;)
    if (chosen.count(i)) out.push_back({runs[i].run->id, runs[i].run->dir, runs[i].bytes, why[i]});
  return out;
}

std::uint64_t dir_bytes(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  return fd < 0 ? 0 : walk(fd, 0);
}

void measure_run(RunRecord& r) {
  r.bytes = dir_bytes(r.dir);
  r.kept = ::access((r.dir + "/" + kKeepFile).c_str(), F_OK) == 0;
}

std::vector<PruneVictim> prune_runs(const std::string& root, const RetentionPolicy& policy, bool dry_run) {
  if (!policy.any()) return {};
  const auto runs = list_runs(root);
  std::vector<PruneCandidate> candidates;
  candidates.reserve(runs.size());
  for (const auto& r : runs) {
    PruneCandidate c{&r};
    c.kept = ::access((r.dir + "/" + kKeepFile).c_str(), F_OK) == 0;
    if (policy.max_bytes || dry_run) c.bytes = dir_bytes(r.dir);
    candidates.push_back(c);
  }
  auto victims = plan_prune(candidates, policy, now_seconds());
  // A run of a Slurm job may look ended while its job lives on: requeued (its payload and join
  // token are needed again when it starts), or its host killed before it wrote the end. Only
  // a run whose job Slurm says is over goes; one Slurm cannot answer for stays for a later
  // prune. One squeue call for them all, and none when no victim is a Slurm job's.
  std::vector<std::string> jobs;
  for (const auto& v : victims)
    for (const auto& c : candidates)
      if (c.run->dir == v.dir && !c.run->scheduler_job_id.empty()) jobs.push_back(c.run->scheduler_job_id);
  if (!jobs.empty()) {
    SlurmJobs& slurm = shared_slurm_jobs();
    slurm.ask(jobs);
    for (auto& c : candidates)
      if (!c.run->scheduler_job_id.empty()) c.job_alive = slurm.active(c.run->scheduler_job_id) != std::optional<bool>(false);
    victims = plan_prune(candidates, policy, now_seconds());
  }
  for (auto& v : victims) {
    if (v.bytes == 0) v.bytes = dir_bytes(v.dir);
    if (dry_run) continue;
    std::error_code ec;
    std::filesystem::remove_all(v.dir, ec);
    if (ec) v.why += " (not removed: " + ec.message() + ")";
  }
  return victims;
}

RetentionPolicy launch_retention(const std::optional<std::string>& configured) {
  if (configured) return parse_retention(*configured, "retention");  // checked when the file was read
  const std::string text = getenv_or("AIRHOST_RETENTION", "");
  if (text.empty()) return default_retention();
  try {
    return parse_retention(text, "AIRHOST_RETENTION");
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "airhost: %s; no run directory was pruned\n", e.what());
    return {};
  }
}

int runs_prune_command(const std::vector<std::string>& args) {
  try {
    RetentionPolicy policy;
    bool dry_run = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&](const std::string& name, const std::string& example) {
        if (a.size() > name.size() && a[name.size()] == '=') return a.substr(name.size() + 1);
        if (i + 1 >= args.size()) throw ConfigError(name + " needs a value, e.g. " + name + " " + example);
        return args[++i];
      };
      if (a == "--dry-run") dry_run = true;
      else if (a.rfind("--older-than", 0) == 0) {
        const std::string v = value("--older-than", "7d");
        const auto seconds = parse_duration_seconds(v, "--older-than").count();
        // 0 would be "every ended run", where --timeout 0 means "no limit": refused, not guessed.
        if (seconds <= 0)
          throw ConfigError("--older-than must be more than 0, got '" + v + "'; e.g. --older-than 7d (--keep 0 removes "
                            "every ended run)");
        policy.older_than_seconds = static_cast<double>(seconds);
      } else if (a.rfind("--keep", 0) == 0) {
        const std::string v = value("--keep", "100");
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end || n < 0)
          throw ConfigError("--keep takes a count of runs (0 or more), got '" + v + "'; e.g. --keep 100");
        policy.keep = n;
      }
      else if (a.rfind("--max-size", 0) == 0) policy.max_bytes = parse_size(value("--max-size", "20G"), "--max-size");
      else
        throw ConfigError("airhost runs prune takes --older-than D, --keep N, --max-size S and --dry-run, got '" + a +
                          "'; e.g. airhost runs prune --older-than 7d --dry-run");
    }
    // Without a bound of its own, prune applies the policy every launch applies.
    if (!policy.any()) policy = launch_retention();
    if (!policy.any()) {
      std::fprintf(stderr, "airhost: retention is off (AIRHOST_RETENTION=off) and no bound was given; nothing to do\n");
      return 0;
    }
    const auto victims = prune_runs(default_runs_root(), policy, dry_run);
    std::uint64_t freed = 0;
    for (const auto& v : victims) {
      std::printf("%s %s  %s  (%s)\n", dry_run ? "would remove" : "removed", v.id.c_str(),
                  bytes_text(static_cast<double>(v.bytes)).c_str(), v.why.c_str());
      freed += v.bytes;
    }
    std::printf("%s %zu run(s), %s%s\n", dry_run ? "would remove" : "removed", victims.size(),
                bytes_text(static_cast<double>(freed)).c_str(), dry_run ? " would be freed" : " freed");
    std::fprintf(stderr, "airhost: live runs and kept ones (airhost runs keep ID) are never removed; MLflow's store is "
                 "not touched (mlflow gc prunes it)\n");
    return 0;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "airhost: %s\n", e.what());
    return to_int(ExitCode::usage);
  }
}

int runs_keep_command(const std::vector<std::string>& args) {
  try {
    bool undo = false;
    std::vector<std::string> ids;
    for (const auto& a : args) {
      if (a == "--undo") undo = true;
      else if (!a.empty() && a[0] == '-') throw ConfigError("airhost runs keep takes a run id and --undo, got '" + a + "'");
      else ids.push_back(a);
    }
    if (ids.size() != 1) throw ConfigError("airhost runs keep takes one run id, e.g. airhost runs keep latest");
    const auto runs = list_runs(default_runs_root(), false);
    const RunRecord& r = resolve_run(runs, ids[0], default_runs_root());
    const std::string marker = r.dir + "/" + kKeepFile;
    if (undo) {
      ::unlink(marker.c_str());
      std::printf("run %s may be pruned again\n", r.id.c_str());
    } else {
      write_file_atomic(marker, "kept by airhost runs keep: never pruned (airhost runs keep " + r.id + " --undo)\n");
      std::printf("run %s is kept: no prune removes it\n", r.id.c_str());
    }
    return 0;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "airhost: %s\n", e.what());
    return to_int(ExitCode::usage);
  }
}

}  // namespace airhost::detail
