// test_run_records.cpp — run.json read back: the record, a run whose host is gone, run ids as
// typed (latest, a prefix, unknown, ambiguous), the table of `airhost runs`, and the JSON
// reader under them.
#include <doctest/doctest.h>

#include "support.hpp"

#include <sstream>
#include <string>
#include <vector>

#include "airhost/launch.hpp"
#include "airhost/report.hpp"
#include "base/errors.hpp"
#include "base/json_value.hpp"
#include "cli/run_records.hpp"
#include "launch/run/run_dir.hpp"
#include "launch/run/run_report.hpp"

using airhost::detail::ConfigError;
using airhost::detail::JsonError;
using airhost::detail::JsonValue;
using airhost::detail::RunRecord;
using namespace airhost::detail;

namespace {

std::string record_text(const std::string& id, const std::string& state, double started, const std::string& extra = "") {
  return "{\"run_id\": \"" + id + "\", \"state\": \"" + state + "\", \"exit_code\": " +
         (state == "running" ? "null" : "0") + ", \"started_at\": " + std::to_string(started) +
         ", \"host_pid\": 4321, \"host_start_ticks\": 99, \"hostname\": \"here\", \"nprocs\": 2, \"nnodes\": 1" + extra + "}";
}

RunRecord record(const std::string& id, double started = 0) {
  RunRecord r;
  r.id = id;
  r.state = "succeeded";
  r.started_at = started;
  return r;
}

}  // namespace

TEST_CASE("the JSON reader takes what run.json holds, escapes and all, and names where a bad text breaks") {
  const auto v = JsonValue::parse(R"( {"a": [1, -2.5e1, true, null], "s": "tab\there \u00e9 \ud83d\ude00 \"q\"", "o": {}} )");
  CHECK(v["a"].size() == 4);
  CHECK(v["a"][1].num() == -25.0);
  CHECK(v["a"][2].boolean());
  CHECK(v["a"][3].is_null());
  CHECK(v["s"].str() == "tab\there \xc3\xa9 \xf0\x9f\x98\x80 \"q\"");
  CHECK(v["o"].size() == 0);
  CHECK(v["missing"]["deeper"].str("fallback") == "fallback");
  CHECK(v["a"][9].integer(7) == 7);
  CHECK_THROWS_WITH_AS(JsonValue::parse("{\"a\": }"), "invalid JSON at byte 6: expected a value", JsonError);
  CHECK_THROWS_AS(JsonValue::parse("[1, 2"), JsonError);
  CHECK_THROWS_AS(JsonValue::parse("{} x"), JsonError);
}

TEST_CASE("run.json as the launcher writes it, at the start and at the end, reads back as one record") {
  airhost::LaunchSpec spec;
  spec.run_id = "20261205-010203-abcdef";
  spec.run_dir = "/runs/" + spec.run_id;
  spec.nprocs = 2;
  spec.entry.kind = airhost::Entry::Kind::function;
  spec.entry.target = "pkg.train";
  spec.entry.function = "main";
  spec.entry.module_target = true;
  spec.entry.args = {"--lr", "0.1"};
  spec.handle_signals = true;
  airhost_test::ScopedEnv env;
  env.set("SLURM_JOB_ID", "77");

  const RunRecord live = parse_run_record(spec.run_dir, run_json_started(spec, 1000.5));
  CHECK(live.state == "running");
  CHECK(!live.exit_code);
  CHECK(live.started_at == doctest::Approx(1000.5));
  CHECK(live.host_pid == static_cast<int>(::getpid()));
  CHECK(live.host_start_ticks > 0);
  CHECK(live.host_handles_signals);
  CHECK(live.scheduler_job_id == "77");
  CHECK(live.entry == "-m pkg.train:main");
  CHECK(live.args == std::vector<std::string>{"--lr", "0.1"});
  REQUIRE(live.ranks.size() == 2);
  CHECK(live.ranks[1].stdout_log == spec.run_dir + "/logs/rank-1.stdout.log");

  airhost::RunReport report;
  report.run_id = spec.run_id;
  report.run_dir = spec.run_dir;
  report.outcome = airhost::Outcome::failed;
  report.exit_code = 3;
  report.root_cause = 1;
  report.wall_seconds = 12.5;
  airhost::RankReport rank;
  rank.rank = 1;
  rank.local_rank = 1;
  rank.state = airhost::RankState::failed;
  rank.exit_code = 3;
  rank.error = airhost::ErrorRecord{"ValueError", "boom", "Traceback (most recent call last):\nValueError: boom\n", "", 1};
  report.ranks = {rank};
  const RunRecord end = parse_run_record(spec.run_dir, run_json(report, spec, 1000.5));
  CHECK(end.state == "failed");
  CHECK(end.exit_code == 3);
  CHECK(end.ended_at == doctest::Approx(1013.0));
  CHECK(end.root_cause == 1);
  REQUIRE(end.ranks.size() == 1);
  CHECK(end.ranks[0].has_error);
  CHECK(end.ranks[0].traceback == "Traceback (most recent call last):\nValueError: boom\n");
}

TEST_CASE("a run is cancelled when airhost cancel asked for it and it did not succeed") {
  CHECK(final_state(airhost::Outcome::interrupted, true) == "cancelled");
  CHECK(final_state(airhost::Outcome::interrupted, false) == "interrupted");
  CHECK(final_state(airhost::Outcome::failed, true) == "cancelled");  // scancel reached a rank first
  CHECK(final_state(airhost::Outcome::failed, false) == "failed");
  CHECK(final_state(airhost::Outcome::succeeded, true) == "succeeded");  // it was done before the cancel
  CHECK(final_state(airhost::Outcome::timed_out, false) == "timed_out");
  // After the scheduler's warning: stopped for the job's time, however the ranks left.
  CHECK(final_state(airhost::Outcome::failed, false, true) == "preempted");
  CHECK(final_state(airhost::Outcome::failed, false, true, true) == "requeued");  // its caller requeues it
  CHECK(final_state(airhost::Outcome::interrupted, true, true, true) == "cancelled");
  CHECK(final_state(airhost::Outcome::succeeded, false, true, true) == "succeeded");
  CHECK(final_state(airhost::Outcome::interrupted, false, true) == "preempted");
  CHECK(final_state(airhost::Outcome::succeeded, false, true) == "succeeded");
  CHECK(final_state(airhost::Outcome::failed, true, true) == "cancelled");
}

TEST_CASE("a running record whose host is gone is lost, one on another host unknown, a live one running") {
  auto alive = [](int pid, std::uint64_t ticks) { return pid == 4321 && ticks == 99; };
  auto dead = [](int, std::uint64_t) { return false; };
  RunRecord r = parse_run_record("/runs/a", record_text("a", "running", 10));
  settle(r, "here", alive);
  CHECK(r.state == "running");
  r = parse_run_record("/runs/a", record_text("a", "running", 10));
  settle(r, "here", dead);
  CHECK(r.state == "lost");
  CHECK(r.problem.find("pid 4321") != std::string::npos);
  r = parse_run_record("/runs/a", record_text("a", "running", 10));
  settle(r, "elsewhere", dead);
  CHECK(r.state == "unknown");
  r = parse_run_record("/runs/a", record_text("a", "succeeded", 10));
  settle(r, "here", dead);
  CHECK(r.state == "succeeded");  // an ended run needs no host
  CHECK(is_ended("cancelled"));
  CHECK(!is_ended("lost"));
}

TEST_CASE("records written before run.json had a state, and texts that are not JSON, still list") {
  RunRecord old = parse_run_record("/runs/old", R"({"run_id": "old", "outcome": "timed_out", "exit_code": 124})");
  CHECK(old.state == "timed_out");
  CHECK(old.exit_code == 124);
  RunRecord broken = parse_run_record("/runs/broken", "{\"run_id\": ");
  CHECK(broken.id == "broken");
  CHECK(broken.state == "unknown");
  CHECK(broken.problem.find("its record /runs/broken/run.json is corrupt (invalid JSON") == 0);
}

TEST_CASE("a run id is latest, a full id or a unique prefix; anything else is one sentence") {
  const std::vector<RunRecord> runs = {record("20261205-0300-bbb", 3), record("20261205-0200-aaa", 2),
                                       record("20261204-2300-ccc", 1)};
  CHECK(resolve_run(runs, "latest", "/r").id == "20261205-0300-bbb");
  CHECK(resolve_run(runs, "20261205-0200-aaa", "/r").id == "20261205-0200-aaa");
  CHECK(resolve_run(runs, "20261204", "/r").id == "20261204-2300-ccc");
  CHECK_THROWS_WITH_AS(resolve_run(runs, "nope", "/r"), "no run 'nope' in /r; airhost runs lists the runs there",
                       ConfigError);
  CHECK_THROWS_WITH_AS(resolve_run(runs, "20261205", "/r"),
                       "run id '20261205' is ambiguous: 2 runs start with it (20261205-0300-bbb, 20261205-0200-aaa); "
                       "give more of it",
                       ConfigError);
  CHECK_THROWS_WITH_AS(resolve_run({}, "latest", "/r"),
                       "no runs in /r yet (AIRHOST_RUNS_DIR chooses where runs are kept)", ConfigError);
}

TEST_CASE("the runs table lines up its columns, a running run's duration counting to now") {
  RunRecord a = record("run-b", 1000);
  a.state = "running";
  a.nprocs = 8;
  a.nnodes = 2;
  a.entry = "train.py";
  a.args = {"--lr", "0.1"};
  a.scheduler_job_id = "123";
  RunRecord b = record("run-a", 900);
  b.exit_code = 0;
  b.nprocs = 2;
  b.ended_at = 960;
  b.wall_seconds = 60;
  b.entry = "-m pkg:main";
  b.bytes = 3 << 20;
  b.kept = true;
  const std::string table = runs_table({a, b}, 1000 + 3725);
  const auto first_nl = table.find('\n');
  const std::string header = table.substr(0, first_nl);
  CHECK(header.rfind("ID      STATE      NODES×RANKS  STARTED", 0) == 0);
  CHECK(table.find("run-b   running    2×8") != std::string::npos);
  CHECK(table.find("1h 02m") != std::string::npos);
  INFO(table);
  CHECK(table.find("123  train.py --lr 0.1\n") != std::string::npos);  // the entry last, not padded
  CHECK(table.find("run-a*  succeeded  1×2") != std::string::npos);     // kept, marked
  CHECK(table.find("1m 00s    0     3 MiB  -    -m pkg:main\n") != std::string::npos);
  CHECK(table.find("\n* kept: never pruned") != std::string::npos);
  // No line wider than the terminal: the entry is cut, the other columns stay whole.
  a.args = {"--a-very-long-argument", "value", "--and-another-one", "more"};
  const std::string narrow = runs_table({a, b}, 1000 + 3725, 100);
  std::istringstream lines(narrow);
  for (std::string line; std::getline(lines, line);) {
    std::size_t chars = 0;
    for (unsigned char c : line) chars += (c & 0xC0) != 0x80;
    CHECK(chars <= 100);
  }
  INFO(narrow);
  CHECK(narrow.find("123  train.py --a-ver...\n") != std::string::npos);
  CHECK(narrow.find("...\n") != std::string::npos);
  const auto json = JsonValue::parse(runs_json({a, b}, 1000 + 3725));
  CHECK(json.size() == 2);
  CHECK(json[0]["state"].str() == "running");
  CHECK(json[0]["exit_code"].is_null());
  CHECK(json[0]["duration_seconds"].num() == doctest::Approx(3725));
  CHECK(json[1]["exit_code"].integer() == 0);
  CHECK(duration_text(3.25) == "3.2 s");
  CHECK(duration_text(-1) == "-");
}

TEST_CASE("squeue's answer for several jobs: each asked job active or not, a job it leaves out has ended") {
  const std::string out =
      "101 PENDING\n"
      "102 COMPLETED\n"
      "103_4 RUNNING\n"        // a task of array job 103
      "105 CANCELLED by 0\n"   // a state with words after it
      "106 REQUEUE_HOLD\n"
      "107 COMPLETING\n"
      "garbage\n";
  const auto states = parse_squeue_states({"101", "102", "103", "104", "105", "106", "107", "10"}, out);
  REQUIRE(states.size() == 8);
  const std::vector<std::pair<std::string, bool>> expected = {
      {"101", true}, {"102", false}, {"103", true}, {"104", false},
      {"105", false}, {"106", true}, {"107", true}, {"10", false}};  // 10 is not 101's prefix
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO(expected[i].first);
    CHECK(states[i] == expected[i]);
  }
  CHECK(parse_squeue_states({"1"}, "").front().second == false);
}

TEST_CASE("a run id has the shape airhost makes; a user's folder has not") {
  CHECK(looks_like_run_id(make_run_id()));
  CHECK(looks_like_run_id("20261206-191149-e05275"));
  CHECK_FALSE(looks_like_run_id("backup"));
  CHECK_FALSE(looks_like_run_id("20261206-191149-e05275-node1"));
  CHECK_FALSE(looks_like_run_id("20261206-191149-E05275"));
  CHECK_FALSE(looks_like_run_id("2026120x-191149-e05275"));
}
