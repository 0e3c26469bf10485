// test_stacks_service.cpp — the host's side of `airhost stacks` on a real libuv loop, with real
// processes as ranks: a request for every rank never takes the answer of a request under way
// that asks fewer (the hang watch asks the ranks it suspects), and a sampling refuses a second
// one. The "ranks" here are forked children that catch the stacks signal and never answer, so
// a request stays under way for its whole wait.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <chrono>
#include <string>
#include <vector>

#include "launch/stacks_service.hpp"
#include "support.hpp"

using namespace airhost::detail;
using namespace std::chrono_literals;

namespace {

// A child that catches stacks_signal() (so the service asks it) and sleeps until killed.
struct SilentRank {
  pid_t pid = -1;
  SilentRank() {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      struct sigaction sa {};
      sa.sa_handler = [](int) {};
      ::sigaction(stacks_signal(), &sa, nullptr);
      (void)!::write(ready[1], "x", 1);
      for (;;) ::pause();
    }
    char c;
    ::close(ready[1]);
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
  }
  ~SilentRank() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace

TEST_CASE("a request for every rank is not answered by one under way that asks some ranks only") {
  airhost_test::TempDir dir;
  SilentRank zero, one;
  uv_loop_t loop;
  uv_loop_init(&loop);
  StacksService::Options opt;
  opt.loop = &loop;
  opt.run_id = "r1";
  opt.run_dir = dir.path();
  opt.wait = 200ms;
  opt.ranks = [&] {
    return std::vector<StacksService::Rank>{{0, 0, zero.pid, true}, {1, 1, one.pid, true}};
  };
  StacksService service(opt);
  REQUIRE(service.start() == "");

  std::vector<StacksSnapshot> partial, full, shared;
  const std::vector<int> only_zero{0};
  service.collect([&](const StacksSnapshot& s) { partial.push_back(s); }, false, &only_zero);
  service.collect([&](const StacksSnapshot& s) { full.push_back(s); }, false);                  // its own round
  service.collect([&](const StacksSnapshot& s) { shared.push_back(s); }, false, &only_zero);  // shares the first
  uv_timer_t stop;
  uv_timer_init(&loop, &stop);
  stop.data = &service;
  uv_timer_start(&stop, [](uv_timer_t* t) { static_cast<StacksService*>(t->data)->close(); }, 1500, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  REQUIRE(uv_loop_close(&loop) == 0);

  REQUIRE(partial.size() == 1);
  REQUIRE(full.size() == 1);
  REQUIRE(shared.size() == 1);
  REQUIRE(partial[0].ranks.size() == 2);
  CHECK(partial[0].ranks[1].status == "not asked");
  CHECK(shared[0].ranks[1].status == "not asked");
  // Both ranks asked, after the first round: neither answers (they only catch the signal).
  REQUIRE(full[0].ranks.size() == 2);
  CHECK(full[0].ranks[0].status == "no answer within 0.2 s");
  CHECK(full[0].ranks[1].status == "no answer within 0.2 s");
  CHECK(full[0].taken_at > partial[0].taken_at);
}

TEST_CASE("one sampling at a time: rounds every interval, each rank's CPU, the profile written down") {
  airhost_test::TempDir dir;
  SilentRank zero;
  uv_loop_t loop;
  uv_loop_init(&loop);
  StacksService::Options opt;
  opt.loop = &loop;
  opt.run_id = "r1";
  opt.run_dir = dir.path();
  opt.wait = 30ms;
  opt.ranks = [&] { return std::vector<StacksService::Rank>{{0, 0, zero.pid, true}}; };
  StacksService service(opt);
  REQUIRE(service.start() == "");

  std::vector<StacksSample> samples;
  CHECK(service.sample(600ms, 100ms, [&](const StacksSample& s) {
    samples.push_back(s);
    service.close();
  }) == "");
  CHECK(service.sample(600ms, 100ms, [&](const StacksSample&) { FAIL("a second sampling ran"); }) ==
        "a sampling of this run is under way; ask again when it ends");
  uv_run(&loop, UV_RUN_DEFAULT);
  REQUIRE(uv_loop_close(&loop) == 0);

  REQUIRE(samples.size() == 1);
  const StacksSample& s = samples[0];
  CHECK(s.run_id == "r1");
  CHECK(s.seconds >= 0.6);
  CHECK(s.interval_ms == 100);
  CHECK(s.rounds >= 4);
  CHECK(s.rounds <= 7);
  REQUIRE(s.ranks.size() == 1);
  CHECK(s.ranks[0].asked == s.rounds);
  CHECK(s.ranks[0].answered == 0);
  CHECK(s.ranks[0].cpu_percent >= 0);   // /proc read at both ends
  CHECK(s.ranks[0].cpu_percent < 50);  // it sleeps
  REQUIRE_FALSE(s.file.empty());
  CHECK(s.file.find("/stacks/sample-") != std::string::npos);
  CHECK(::access(s.file.c_str(), F_OK) == 0);
}
