// The public API end to end: real rank processes running real Python scripts.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "airhost/airhost.hpp"
#include "support.hpp"

using namespace airhost;

using airhost_test::TempDir;
using airhost_test::free_port;

namespace {


LaunchSpec spec_for(const TempDir& dir, const std::string& script, int nprocs) {
  LaunchSpec spec;
  spec.entry.target = script;
  spec.nprocs = nprocs;
  spec.rank_binary = airhost_test::rank_binary();
  spec.run_dir = dir.path() + "/run-" + std::to_string(std::rand());
  spec.output.forward = false;
  spec.grace = std::chrono::milliseconds(2000);
  return spec;
}

struct Recorder {
  std::mutex m;
  std::vector<std::string> lines;
  std::vector<RankEvent> events;
  Callbacks callbacks() {
    Callbacks cb;
    cb.on_output = [this](int rank, Stream s, std::string_view line) {
      std::lock_guard l(m);
      lines.push_back(std::to_string(rank) + (s == Stream::out ? " out " : " err ") + std::string(line));
    };
    cb.on_rank_event = [this](const RankEvent& e) {
      std::lock_guard l(m);
      events.push_back(e);
    };
    return cb;
  }
  bool has(const std::string& line) {
    std::lock_guard l(m);
    return std::find(lines.begin(), lines.end(), line) != lines.end();
  }
};

}  // namespace

TEST_CASE("a launch runs every rank, streams their lines and reports each one") {
  TempDir dir;
  auto script = dir.write("hello.py", "import os, sys\nprint('hello', os.environ['RANK'])\nprint('warn', file=sys.stderr)\n");
  Recorder rec;
  Launcher launcher(spec_for(dir, script, 3), rec.callbacks());
  RunReport report = launcher.run();
  CHECK(report.ok());
  CHECK(report.exit_code == 0);
  REQUIRE(report.ranks.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(rec.has(std::to_string(r) + " out hello " + std::to_string(r)));
    CHECK(rec.has(std::to_string(r) + " err warn"));
    CHECK(report.ranks[r].state == RankState::succeeded);
    CHECK(report.ranks[r].pid > 0);
  }
  CHECK(rec.events.size() == 6);  // started and exited, per rank
  CHECK(access((report.run_dir + "/run.json").c_str(), R_OK) == 0);
}

TEST_CASE("a run that ends, torn down or not, leaves no child of this process behind, zombie or live") {
  // The ranks and the run's group guard (host/launch/procs/group_guard.hpp) are children of the host,
  // which must reap every one of them: a zombie per run would pile up in a long-lived
  // caller (a notebook kernel).
  TempDir dir;
  auto script = dir.write("mixed.py",
                          "import os, subprocess, time\nsubprocess.Popen(['sleep', '300'])\n"
                          "if os.environ['RANK'] == '1':\n    raise SystemExit(3)\ntime.sleep(30)\n");
  RunReport report = Launcher(spec_for(dir, script, 2)).run();
  CHECK(report.outcome == Outcome::failed);
  CHECK(report.exit_code == 3);
  int status = 0;
  errno = 0;
  CHECK(::waitpid(-1, &status, WNOHANG) == -1);
  CHECK(errno == ECHILD);
}

TEST_CASE("a function entry hands back each rank's return value as JSON") {
  TempDir dir;
  auto script = dir.write("fn.py", "import os\ndef main():\n    return {'rank': int(os.environ['RANK'])}\n");
  LaunchSpec spec = spec_for(dir, script, 2);
  spec.entry.kind = Entry::Kind::function;
  spec.entry.function = "main";
  spec.entry.result_format = "json";
  RunReport report = Launcher(spec).run();
  REQUIRE(report.ok());
  CHECK(*report.ranks[0].result == "{\"rank\": 0}");
  CHECK(*report.ranks[1].result == "{\"rank\": 1}");
}

TEST_CASE("a rank that raises fails the run with its exception as the root cause") {
  TempDir dir;
  auto script = dir.write("boom.py",
                          "import os, time\nif os.environ['RANK'] == '1':\n    raise ValueError('no good')\ntime.sleep(30)\n");
  RunReport report = Launcher(spec_for(dir, script, 2)).run();
  CHECK(report.outcome == Outcome::failed);
  CHECK(report.exit_code == 1);
  CHECK(report.root_cause == 1);
  REQUIRE(report.ranks[1].error.has_value());
  CHECK(report.ranks[1].error->type == "ValueError");
  CHECK(report.ranks[1].error->message == "no good");
  CHECK(report.ranks[1].error->traceback.find("boom.py\", line 3") != std::string::npos);
  CHECK(report.ranks[0].state == RankState::stopped);
  CHECK(report.wall_seconds < 20);
}

TEST_CASE("cancel from another thread stops every rank and reports an interruption") {
  TempDir dir;
  auto script = dir.write("sleep.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n");
  Recorder rec;
  Launcher launcher(spec_for(dir, script, 2), rec.callbacks());
  std::thread canceller([&] {
    for (int i = 0; i < 300 && !(rec.has("0 out up") && rec.has("1 out up")); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    launcher.cancel(SIGTERM);
  });
  auto t0 = std::chrono::steady_clock::now();
  RunReport report = launcher.run();
  canceller.join();
  CHECK(report.outcome == Outcome::interrupted);
  CHECK(report.exit_code == 143);
  CHECK(report.interrupt_signal == SIGTERM);
  for (auto& r : report.ranks) {
    CHECK(r.state == RankState::stopped);
    CHECK(kill(r.pid, 0) != 0);  // gone (reaped)
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("cancel before run starts makes the run stop at once") {
  TempDir dir;
  auto script = dir.write("sleep.py", "import time\ntime.sleep(60)\n");
  Launcher launcher(spec_for(dir, script, 1));
  launcher.cancel();
  RunReport report = launcher.run();
  CHECK(report.outcome == Outcome::interrupted);
  CHECK(report.exit_code == 130);
}

TEST_CASE("two launches in one program, one after the other and at the same time") {
  TempDir dir;
  auto script = dir.write("port.py", "import os\nprint(os.environ['MASTER_PORT'], os.environ['AIRHOST_RUN_ID'])\n");
  for (int i = 0; i < 2; ++i) CHECK(Launcher(spec_for(dir, script, 2)).run().ok());

  RunReport a, b;
  Recorder ra, rb;
  LaunchSpec sa = spec_for(dir, script, 2), sb = spec_for(dir, script, 2);
  sb.run_dir += "-b";
  std::thread ta([&] { a = Launcher(sa, ra.callbacks()).run(); });
  std::thread tb([&] { b = Launcher(sb, rb.callbacks()).run(); });
  ta.join();
  tb.join();
  CHECK(a.ok());
  CHECK(b.ok());
  CHECK(a.run_id != b.run_id);
  REQUIRE(!ra.lines.empty());
  REQUIRE(!rb.lines.empty());
  CHECK(ra.lines[0].substr(6, 5) != rb.lines[0].substr(6, 5));  // distinct MASTER_PORTs
}

TEST_CASE("a spec that cannot run is refused before anything starts") {
  TempDir dir;
  LaunchSpec spec = spec_for(dir, dir.path() + "/missing.py", 1);
  CHECK_THROWS_WITH_AS(Launcher(spec).run(), doctest::Contains("not found"), LaunchError);
  spec = spec_for(dir, dir.write("ok.py", "pass\n"), 0);
  CHECK_THROWS_WITH_AS(Launcher(spec).run(), doctest::Contains("at least 1"), LaunchError);
  spec = spec_for(dir, dir.write("ok.py", "pass\n"), 1);
  spec.rank_binary = "/nonexistent/airhost-rank";
  CHECK_THROWS_WITH_AS(Launcher(spec).run(), doctest::Contains("AIRHOST_RANK_BINARY"), LaunchError);
}

TEST_CASE("a launcher runs once") {
  TempDir dir;
  Launcher launcher(spec_for(dir, dir.write("ok.py", "pass\n"), 1));
  CHECK(launcher.run().ok());
  CHECK_THROWS_AS(launcher.run(), LaunchError);
}

TEST_CASE("a failed group is restarted up to max_restarts times, and on_restart hears of each") {
  TempDir dir;
  auto script = dir.write("flaky.py",
                          "import os, sys\n"
                          "n = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                          "print('attempt', n, 'of', os.environ['TORCHELASTIC_MAX_RESTARTS'])\n"
                          "sys.exit(5 if n < int(os.environ['FAIL_UNTIL']) and os.environ['RANK'] == '0' else 0)\n");
  std::vector<RestartEvent> restarts;
  Recorder rec;
  Callbacks cb = rec.callbacks();
  cb.on_restart = [&](const RestartEvent& e) { restarts.push_back(e); };

  SUBCASE("it succeeds on the third attempt") {
    LaunchSpec spec = spec_for(dir, script, 2);
    spec.max_restarts = 4;
    spec.env["FAIL_UNTIL"] = "2";
    RunReport report = Launcher(spec, cb).run();
    CHECK(report.ok());
    CHECK(report.restarts == 2);
    CHECK(report.failed_attempts.size() == 2);
    REQUIRE(restarts.size() == 2);
    CHECK(restarts[0].restart == 1);
    CHECK(restarts[1].restart == 2);
    CHECK(restarts[1].max_restarts == 4);
    CHECK(restarts[0].reason.find("rank 0 exited with code 5") != std::string::npos);
    for (int n : {0, 1, 2}) CHECK(rec.has("0 out attempt " + std::to_string(n) + " of 4"));
    CHECK_FALSE(rec.has("0 out attempt 3 of 4"));
  }
  SUBCASE("it gives up with the rank's exit code when no restart is left") {
    LaunchSpec spec = spec_for(dir, script, 2);
    spec.max_restarts = 1;
    spec.env["FAIL_UNTIL"] = "9";
    RunReport report = Launcher(spec, cb).run();
    CHECK(report.outcome == Outcome::failed);
    CHECK(report.exit_code == 5);
    CHECK(report.restarts == 1);
    CHECK(restarts.size() == 1);
    CHECK(report.message.find("no restart left") != std::string::npos);
  }
  SUBCASE("cancel() before the run means no attempt is restarted") {
    LaunchSpec spec = spec_for(dir, script, 2);
    spec.max_restarts = 3;
    spec.env["FAIL_UNTIL"] = "9";
    Launcher launcher(spec, cb);
    launcher.cancel(SIGTERM);
    RunReport report = launcher.run();
    CHECK(report.outcome == Outcome::interrupted);
    CHECK(report.restarts == 0);
    CHECK(restarts.empty());
  }
}

TEST_CASE("a rank that lost its peer is not the root cause when another rank crashed, whatever the times say") {
  TempDir dir;
  // Rank 0 raises gloo's words for a dead peer first (and lingers in atexit, so no teardown
  // starts); rank 1 then dies of a signal. Only the time stamps are in the opposite order of
  // a real crash, which is what the lag of SIGCHLD behind a peer's socket error can do.
  auto script = dir.write("lost.py",
                          "import atexit, os, signal, time\n"
                          "if os.environ['RANK'] == '0':\n"
                          "    atexit.register(time.sleep, 1.5)\n"
                          "    raise RuntimeError('[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                          "[127.0.0.1]:1234. This is typically caused by a remote worker crashing.')\n"
                          "time.sleep(0.5)\n"
                          "os.kill(os.getpid(), signal.SIGSEGV)\n");
  LaunchSpec spec = spec_for(dir, script, 2);
  RunReport report = Launcher(spec, Callbacks{}).run();
  CHECK(report.outcome == Outcome::failed);
  REQUIRE(report.ranks[1].state == RankState::failed);
  REQUIRE(report.ranks[0].error.has_value());
  CHECK(report.ranks[0].error->time < report.ranks[1].ended_at);
  CHECK(report.root_cause == 1);
  CHECK(report.exit_code == 128 + SIGSEGV);
}

TEST_CASE("a rank that writes a frame announcing 2^62 bytes into its control descriptor fails, named, and the run ends by the contract") {
  // The stray write of issue 22: it used to throw std::bad_alloc through uv_run and abort the
  // host with no report. Rank 1 sleeps: it must be stopped by the teardown.
  TempDir dir;
  auto script = dir.write("stray.py",
                          "import os, struct, time\n"
                          "if os.environ['RANK'] == '0':\n"
                          "    os.write(int(os.environ['AIRHOST_CONTROL_FD']), struct.pack('<IHHQ', 0x31464841, 2, 0, 1 << 62))\n"
                          "time.sleep(60)\n");
  auto spec = spec_for(dir, script, 2);
  spec.timeout = std::chrono::seconds(50);
  Launcher launcher(spec, Callbacks{});
  const auto t0 = std::chrono::steady_clock::now();
  RunReport report = launcher.run();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  CHECK(report.outcome == Outcome::failed);
  CHECK(report.exit_code == 1);
  CHECK(report.root_cause == 0);
  REQUIRE(report.ranks[0].error.has_value());
  CHECK(report.ranks[0].error->type == "ControlChannelError");
  CHECK(report.ranks[0].error->message.find("rank 0's control channel") != std::string::npos);
  CHECK(report.ranks[0].error->message.find("over the cap") != std::string::npos);
  CHECK(report.message.find("ControlChannelError") != std::string::npos);
  CHECK(report.ranks[1].state == RankState::stopped);
  std::ifstream json(report.run_dir + "/run.json");
  std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"outcome\": \"failed\"") != std::string::npos);
}

TEST_CASE("an embedding program's callback that throws ends the run by the contract, and is not called again") {
  TempDir dir;
  auto script = dir.write("chatty.py", "import time\nfor i in range(600):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n");
  SUBCASE("on_output") {
    std::atomic<int> calls{0};
    Callbacks cb;
    cb.on_output = [&](int, Stream, std::string_view) {
      ++calls;
      throw std::runtime_error("the embedding program's bug");
    };
    Launcher launcher(spec_for(dir, script, 2), cb);
    RunReport report = launcher.run();  // must return, not throw
    CHECK(report.outcome == Outcome::failed);
    CHECK(report.exit_code == 1);
    CHECK(report.message.find("the on_output callback threw: the embedding program's bug") != std::string::npos);
    CHECK(calls.load() == 1);
    for (const auto& r : report.ranks) CHECK(r.state == RankState::stopped);
    CHECK(access((report.run_dir + "/run.json").c_str(), R_OK) == 0);
  }
  SUBCASE("on_rank_event") {
    Callbacks cb;
    cb.on_rank_event = [](const RankEvent& e) {
      if (e.kind == RankEvent::Kind::started) throw 42;  // not even a std::exception
    };
    Launcher launcher(spec_for(dir, script, 2), cb);
    RunReport report = launcher.run();
    CHECK(report.outcome == Outcome::failed);
    CHECK(report.message.find("the on_rank_event callback threw") != std::string::npos);
  }
}

TEST_CASE("a rank whose exit is seen before its error frame is still named with its exception") {
  // The exit and the error frame come on different descriptors, in no set order. Here the order
  // is forced: rank 0 hands its control descriptor to a process of another session (so that
  // its group's SIGKILL at exit spares it), exits 1, and that process writes the error frame
  // 0.5 s later, then closes it. Rank 1 sleeps.
  TempDir dir;
  auto script = dir.write("late.py",
                          "import os, struct, time\n"
                          "def field(name, value):\n"
                          "    n, v = name.encode(), value.encode()\n"
                          "    return struct.pack('<I', len(n)) + n + struct.pack('<Q', len(v)) + v\n"
                          "if os.environ['RANK'] == '0':\n"
                          "    fd = int(os.environ['AIRHOST_CONTROL_FD'])\n"
                          "    payload = field('message', 'late but first') + field('time', repr(time.time())) + "
                          "field('traceback', 'Traceback: ...') + field('type', 'ValueError')\n"
                          "    ready_r, ready_w = os.pipe()\n"
                          "    if os.fork() == 0:\n"
                          "        os.setsid()\n"
                          "        os.write(ready_w, b'x')\n"
                          "        time.sleep(0.5)\n"
                          "        os.write(fd, struct.pack('<IHHQ', 0x31464841, 3, 0, len(payload)) + payload)\n"
                          "        os._exit(0)\n"
                          "    os.read(ready_r, 1)  # out of the group before the host kills it\n"
                          "    os._exit(1)\n"
                          "time.sleep(60)\n");
  auto spec = spec_for(dir, script, 2);
  Launcher launcher(spec, Callbacks{});
  RunReport report = launcher.run();
  CHECK(report.outcome == Outcome::failed);
  CHECK(report.root_cause == 0);
  CHECK(report.exit_code == 1);
  REQUIRE(report.ranks[0].error.has_value());
  CHECK(report.ranks[0].error->type == "ValueError");
  CHECK(report.message.find("rank 0 exited with code 1 (ValueError: late but first)") != std::string::npos);
  CHECK(report.ranks[1].state == RankState::stopped);
}

TEST_CASE("a node whose loop is stuck in the embedding program's callback is lost by the others within node_timeout") {
  // Issue 22: the node link's thread heartbeated for a node whose supervisor loop was frozen,
  // so the other nodes waited on ranks that nothing watched. Two nodes in this process, one
  // rank each; node 1's on_output never returns (until the test lets it).
  TempDir dir;
  auto script = dir.write("chatty.py", "import time\nfor i in range(300):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n");
  const int port = free_port();
  auto node_spec = [&](int node) {
    LaunchSpec spec = spec_for(dir, script, 1);
    spec.nnodes = 2;
    spec.node_rank = node;
    spec.master_port = port;
    spec.node_timeout = std::chrono::seconds(2);
    spec.join_timeout = std::chrono::seconds(20);
    spec.timeout = std::chrono::seconds(60);
    return spec;
  };
  std::mutex m;
  std::condition_variable cv;
  bool released = false;
  Callbacks stuck;
  stuck.on_output = [&](int, Stream, std::string_view) {
    std::unique_lock lock(m);
    cv.wait_for(lock, std::chrono::seconds(40), [&] { return released; });
  };
  Launcher one(node_spec(1), stuck);
  auto at_one = std::async(std::launch::async, [&] { return one.run(); });
  Launcher zero(node_spec(0), Callbacks{});
  const auto t0 = std::chrono::steady_clock::now();
  RunReport report = zero.run();
  const auto waited = std::chrono::steady_clock::now() - t0;
  {
    std::lock_guard lock(m);
    released = true;
  }
  cv.notify_all();
  RunReport report_one = at_one.get();
  CHECK(waited < std::chrono::seconds(12));  // the join, node_timeout, the teardown; not the 30 s script
  CHECK(report.outcome == Outcome::node_lost);
  CHECK(report.exit_code == 138);
  CHECK(report.message.find("node 1") != std::string::npos);
  CHECK(report.message.find("loop has not turned") != std::string::npos);
  CHECK(report_one.outcome == Outcome::node_lost);  // once its loop is back, node 1 ends too
  CHECK(report_one.exit_code == 138);
  for (const auto& r : report_one.ranks) CHECK(r.state != RankState::running);
}
