// test_rank_usage.cpp — what each rank uses, from /proc as the host reads it: the sums over a
// rank's process group, CPU as a share of one core between samples, the JSON line kept, and
// the report's line naming a rank idle while the others are busy.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/json_value.hpp"
#include "launch/rank_usage.hpp"

using namespace airhost::detail;

namespace {

ProcStat proc(int pid, int pgid, std::uint64_t cpu, std::uint64_t rss) {
  ProcStat p;
  p.pid = pid;
  p.pgid = pgid;
  p.cpu = cpu;
  p.rss = rss;
  return p;
}

}  // namespace

TEST_CASE("a rank's usage is its whole process group's, CPU as a share of one core since its last sample") {
  UsageMeter meter(100);
  // Rank 0 (pid 10) has a DataLoader worker (pid 11) in its group; rank 1 is pid 20; pid 30 is
  // another program.
  std::vector<ProcStat> procs = {proc(10, 10, 1000, 100 << 20), proc(11, 10, 500, 50 << 20), proc(20, 20, 300, 80 << 20),
                                 proc(30, 30, 9999, 1 << 30)};
  auto first = meter.sample(100.0, {{0, 10}, {1, 20}}, procs, 2);
  REQUIRE(first.size() == 2);
  CHECK(first[0].rank == 0);
  CHECK(first[0].node == 2);
  CHECK(first[0].rss == (150u << 20));
  CHECK(first[0].cpu_percent == -1);  // nothing to measure against yet
  // 5 s later: rank 0's group used 500 ticks (5 s: 100% of a core), rank 1 used 5 (1%).
  procs = {proc(10, 10, 1300, 100 << 20), proc(11, 10, 700, 60 << 20), proc(20, 20, 305, 80 << 20)};
  auto second = meter.sample(105.0, {{0, 10}, {1, 20}}, procs, 2);
  REQUIRE(second.size() == 2);
  CHECK(second[0].cpu_percent == doctest::Approx(100.0));
  CHECK(second[1].cpu_percent == doctest::Approx(1.0));
  CHECK(second[0].rss == (160u << 20));
  // A rank whose group is gone meanwhile is left out.
  CHECK(meter.sample(110.0, {{0, 10}, {1, 20}}, {proc(20, 20, 305, 80 << 20)}, 2).size() == 1);

  const auto v = JsonValue::parse(usage_json_line(second[1]));
  CHECK(v["rank"].integer() == 1);
  CHECK(v["node"].integer() == 2);
  CHECK(v["t"].num() == doctest::Approx(105.0));
  CHECK(v["cpu_percent"].num() == doctest::Approx(1.0));
  CHECK(v["rss_bytes"].integer() == (80 << 20));
  CHECK(JsonValue::parse(usage_json_line(first[0]))["cpu_percent"].is_null());
}

TEST_CASE("the report's line: every rank's CPU and memory, and the idle ones among busy ones named") {
  UsageMeter meter(100);
  std::vector<ProcStat> procs = {proc(10, 10, 0, 2ull << 30), proc(20, 20, 0, 300 << 20), proc(30, 30, 0, 300 << 20)};
  CHECK(usage_text(meter.sample(0, {{0, 10}, {1, 20}, {2, 30}}, procs, 0)).empty());  // no CPU figure yet
  procs = {proc(10, 10, 495, 2ull << 30), proc(20, 20, 0, 300 << 20), proc(30, 30, 490, 300 << 20)};
  const std::string text = usage_text(meter.sample(5, {{0, 10}, {1, 20}, {2, 30}}, procs, 0));
  CHECK(text ==
        "what each rank used (CPU of one core, memory resident): rank 0 99% 2.0 GiB; rank 1 0% 300 MiB; rank 2 98% 300 MiB. "
        "Rank 1 is idle while ranks 0,2 are busy");
  // All idle (a hang where every rank waits): no one is named.
  procs = {proc(10, 10, 495, 1 << 30), proc(20, 20, 0, 1 << 30), proc(30, 30, 490, 1 << 30)};
  CHECK(usage_text(meter.sample(10, {{0, 10}, {1, 20}, {2, 30}}, procs, 0)).find("idle while") == std::string::npos);
}
