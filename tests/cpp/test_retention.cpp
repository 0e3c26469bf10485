// test_retention.cpp — which runs a retention policy removes, and its bounds as typed.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/errors.hpp"
#include "cli/retention.hpp"

using namespace airhost::detail;

namespace {
RunRecord run(const std::string& id, const std::string& state, double ended_at) {
  RunRecord r;
  r.id = id;
  r.dir = "/runs/" + id;
  r.state = state;
  r.started_at = ended_at - 10;
  r.ended_at = state == "running" ? 0 : ended_at;
  return r;
}
std::vector<std::string> ids(const std::vector<PruneVictim>& v) {
  std::vector<std::string> out;
  for (const auto& x : v) out.push_back(x.id);
  return out;
}
}  // namespace

TEST_CASE("a policy removes ended runs by age, count and size, oldest first, never a live or kept one") {
  const double now = 100 * 86400;
  // Newest first, as list_runs gives them.
  std::vector<RunRecord> r = {run("f", "running", now), run("e", "succeeded", now - 60), run("d", "failed", now - 86400 * 2),
                              run("c", "lost", now - 86400 * 40), run("b", "pending", now - 86400 * 50),
                              run("a", "cancelled", now - 86400 * 60)};
  std::vector<PruneCandidate> c;
  for (const auto& x : r) c.push_back({&x, 1000, false});
  c[5].kept = true;  // a: airhost runs keep

  RetentionPolicy age;
  age.older_than_seconds = 30.0 * 86400;
  CHECK(ids(plan_prune(c, age, now)) == std::vector<std::string>{"c"});  // b is pending, a kept

  RetentionPolicy count;
  count.keep = 2;  // f and e stay (f, live, counted among them)
  const auto by_count = plan_prune(c, count, now);
  CHECK(ids(by_count) == std::vector<std::string>{"c", "d"});
  CHECK(by_count[0].why == "beyond the newest 2 runs");

  RetentionPolicy size;
  size.max_bytes = 3500;  // 6000 in all: the oldest removable go until 3500 or less is left
  CHECK(ids(plan_prune(c, size, now)) == std::vector<std::string>{"c", "d", "e"});

  CHECK(plan_prune(c, RetentionPolicy{}, now).empty());
}

TEST_CASE("retention and sizes as typed, and one clear sentence for anything else") {
  CHECK_FALSE(parse_retention("off", "AIRHOST_RETENTION").any());
  const auto p = parse_retention("older_than=7d,keep=100,max_size=5G", "AIRHOST_RETENTION");
  CHECK(*p.older_than_seconds == 7 * 86400.0);
  CHECK(*p.keep == 100);
  CHECK(*p.max_bytes == 5ull << 30);
  CHECK(parse_size("512M", "x") == 512ull << 20);
  CHECK(parse_size("1.5T", "x") == (3ull << 40) / 2);
  CHECK(parse_size("20GB", "x") == 20ull << 30);
  CHECK(parse_size("4096", "x") == 4096);
  CHECK_THROWS_AS(parse_size("lots", "x"), ConfigError);
  CHECK_THROWS_AS(parse_retention("forever", "AIRHOST_RETENTION"), ConfigError);
  CHECK_THROWS_AS(parse_retention("keep=-1", "AIRHOST_RETENTION"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_retention("size=5G", "AIRHOST_RETENTION"),
                       "AIRHOST_RETENTION has no 'size'; it takes older_than, keep and max_size, e.g. "
                       "older_than=7d,keep=100,max_size=5G (or off)",
                       ConfigError);
  const auto d = default_retention();
  CHECK((*d.older_than_seconds == 30 * 86400.0 && *d.keep == 1000 && *d.max_bytes == 20ull << 30));
}
