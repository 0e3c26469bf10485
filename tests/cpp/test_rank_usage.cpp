// test_rank_usage.cpp — what each rank uses, from /proc as the host reads it: the sums over a
// rank's process group, CPU as a share of one core between samples, the JSON line kept, and
// the report's line naming a rank idle while the others are busy.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/json_value.hpp"
#include "launch/watch/rank_usage.hpp"

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

TEST_CASE("a rank's GPU is the one its processes hold memory on; else the one its LOCAL_RANK selects") {
  airhost::GpuUsage gpus;
  gpus.devices = {{0, 97, 70ull << 30, 80ull << 30}, {1, 0, 2ull << 30, 80ull << 30}, {2, -1, 0, 80ull << 30}};
  // Rank 0 (group 10, 11) holds memory on GPU 1 (its worker a little on GPU 0); pid 99 is another program.
  gpus.processes = {{10, 1, 3ull << 30}, {11, 1, 1ull << 30}, {11, 0, 1ull << 20}, {99, 0, 60ull << 30}};
  RankUsage r0;
  add_gpu_usage(r0, {10, 11}, 0, gpus);
  CHECK(r0.gpu == 1);
  CHECK(r0.gpu_util_percent == 0);
  CHECK(r0.gpu_memory == (4ull << 30));
  // Rank 1 is not listed (another PID namespace, or no CUDA yet): the GPU of its LOCAL_RANK, whole.
  RankUsage r1;
  add_gpu_usage(r1, {20}, 0, gpus);
  CHECK(r1.gpu == 0);
  CHECK(r1.gpu_util_percent == 97);
  CHECK(r1.gpu_memory == (70ull << 30));
  // No device to fall back on, or one NVML does not list: no GPU figures at all.
  RankUsage r2;
  add_gpu_usage(r2, {30}, -1, gpus);
  CHECK(r2.gpu == -1);
  add_gpu_usage(r2, {30}, 7, gpus);
  CHECK(r2.gpu == -1);
  RankUsage r3;
  add_gpu_usage(r3, {30}, 2, gpus);
  CHECK(r3.gpu == 2);
  CHECK(r3.gpu_util_percent == -1);  // the driver could not tell

  r1.t = 1, r1.rank = 1, r1.cpu_percent = 1, r1.rss = 1 << 30;
  const auto line = JsonValue::parse(usage_json_line(r1));
  CHECK(line["gpu"].integer() == 0);
  CHECK(line["gpu_util_percent"].integer() == 97);
  CHECK(line["gpu_memory_bytes"].integer() == (70ll << 30));
  r3.t = 1, r3.rank = 3, r3.cpu_percent = 1;
  CHECK(JsonValue::parse(usage_json_line(r3))["gpu_util_percent"].is_null());
  RankUsage cpu_only;
  cpu_only.t = 1;
  CHECK_FALSE(JsonValue::parse(usage_json_line(cpu_only)).has("gpu"));
}

TEST_CASE("the report counts a rank busy on its GPU as busy, and names one idle on both") {
  RankUsage a, b, c;
  a.rank = 0, a.cpu_percent = 2, a.gpu = 0, a.gpu_util_percent = 98, a.gpu_memory = 70ull << 30;  // feeding its GPU
  b.rank = 1, b.cpu_percent = 1, b.gpu = 1, b.gpu_util_percent = 0, b.gpu_memory = 1ull << 30;   // stuck
  c.rank = 2, c.cpu_percent = 99, c.gpu = 2, c.gpu_util_percent = 3;                             // busy on the CPU
  const std::string text = usage_text({a, b, c});
  CHECK(text.find("its GPU, GPU memory") != std::string::npos);
  CHECK(text.find("rank 0 2% 0 MiB, GPU 0 98% 70.0 GiB") != std::string::npos);
  CHECK(text.find("rank 1 1% 0 MiB, GPU 1 0% 1.0 GiB") != std::string::npos);
  CHECK(text.find("Rank 1 is idle while ranks 0,2 are busy") != std::string::npos);
}

#ifdef AIRHOST_FAKE_NVML_PATH
#include <chrono>
#include <cstdio>
#include <thread>

#include "support.hpp"

TEST_CASE("GpuUsageReader reads each GPU and its processes from NVML (a FAKE NVML: tests/fake_nvml) off its caller's thread") {
  airhost_test::TempDir dir;
  const std::string usage = dir.path() + "/usage";
  {
    std::FILE* f = std::fopen(usage.c_str(), "w");
    REQUIRE(f);
    std::fputs("util 0 91\nproc 0 4242 1073741824\nproc 1 4243 2048\n", f);
    std::fclose(f);
  }
  airhost_test::ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", AIRHOST_FAKE_NVML_PATH)
      .set("AIRHOST_FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3:81559:GPU-a;NVIDIA H100 80GB HBM3:81559:GPU-b")
      .set("AIRHOST_FAKE_NVML_FAIL", std::nullopt)
      .set("AIRHOST_FAKE_NVML_USAGE", usage);
  airhost::GpuUsageReader reader;
  CHECK_FALSE(reader.latest());
  reader.request();
  std::optional<airhost::GpuUsage> got;
  for (int i = 0; i < 500 && !(got = reader.latest()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(got);
  REQUIRE(got->devices.size() == 2);
  CHECK(got->devices[0].util_percent == 91);
  CHECK(got->devices[1].util_percent == 0);
  CHECK(got->devices[0].memory_total == 81559ull << 20);
  REQUIRE(got->processes.size() == 2);
  CHECK(got->processes[0].pid == 4242);
  CHECK(got->processes[0].device == 0);
  CHECK(got->processes[0].memory == (1ull << 30));
  CHECK(got->processes[1].device == 1);
  CHECK(reader.error().empty());
}

TEST_CASE("GpuUsageReader on a node without NVML gives no reading and says why") {
  airhost_test::ScopedEnv env;
  env.set("AIRHOST_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  airhost::GpuUsageReader reader;
  reader.request();
  for (int i = 0; i < 500 && reader.error().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(reader.error().find("could not be loaded") != std::string::npos);
  CHECK_FALSE(reader.latest());
}
#endif
