// test_stacks_sample.cpp — `airhost stacks --sample`: snapshots added one by one make each
// rank's profile (own and total shares per function, the caller of the innermost), ranks
// grouped by where they spend their time (the odd ones out first), and the text and JSON.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/json_value.hpp"
#include "launch/watch/stacks_sample.hpp"

using namespace airhost::detail;

namespace {

const std::string kAllReduce =
    "  File \"/v/torch/distributed/distributed_c10d.py\", line 3252 in all_reduce\n"
    "  File \"/x/train.py\", line 18 in main\n";
std::string load_batch(int line) {
  return "  File \"/x/data.py\", line " + std::to_string(line) + " in load_batch\n"
         "  File \"/x/train.py\", line 16 in main\n";
}
const std::string kStep = "  File \"/x/train.py\", line 20 in step\n  File \"/x/train.py\", line 19 in main\n";

RankStacks rank_at(int rank, const std::string& main_frames) {
  const std::string text = "airhost-stacks seq=1 pid=7 main=4096\nThread 0x0000000000001000 (most recent call first):\n" +
                           main_frames + "airhost-stacks-end seq=1\n";
  auto r = parse_dump(text, 1);
  REQUIRE(r);
  r->rank = rank;
  r->pid = 100 + rank;
  return *r;
}

StacksSnapshot snap(std::vector<RankStacks> ranks) {
  StacksSnapshot s;
  s.run_id = "r1";
  s.ranks = std::move(ranks);
  return s;
}

// Ten rounds: rank 1 spends 6 in load_batch (two lines of it) and 4 in step; ranks 0, 2 and 3
// wait in all_reduce throughout.
StacksSample straggler() {
  StacksSampler sampler;
  for (int i = 0; i < 10; ++i) {
    const std::string one = i < 6 ? load_batch(i % 2 ? 12 : 13) : kStep;
    sampler.add(snap({rank_at(0, kAllReduce), rank_at(1, one), rank_at(2, kAllReduce), rank_at(3, kAllReduce)}));
  }
  auto s = sampler.result();
  s.run_id = "r1";
  s.seconds = 1.0;
  s.interval_ms = 100;
  return s;
}

}  // namespace

TEST_CASE("a profile counts, per rank, where the main thread is (own) and what it is inside (total)") {
  const StacksSample s = straggler();
  CHECK(s.rounds == 10);
  REQUIRE(s.ranks.size() == 4);
  const RankProfile& one = s.ranks[1];
  CHECK(one.rank == 1);
  CHECK(one.pid == 101);
  CHECK(one.asked == 10);
  CHECK(one.answered == 10);
  REQUIRE(one.functions.size() == 3);
  CHECK(one.functions[0].function == "load_batch");
  CHECK(one.functions[0].own == 6);
  CHECK(one.functions[0].total == 6);
  CHECK(one.functions[0].caller == "/x/train.py:16 in main");
  CHECK((one.functions[0].line == 12 || one.functions[0].line == 13));
  CHECK(one.functions[1].function == "step");
  CHECK(one.functions[1].own == 4);
  // main is in every sample (total) and the innermost in none (own): counted once per sample
  // though it appears on two lines.
  CHECK(one.functions[2].function == "main");
  CHECK(one.functions[2].own == 0);
  CHECK(one.functions[2].total == 10);
  CHECK(s.ranks[0].functions[0].function == "all_reduce");
  CHECK(s.ranks[0].functions[0].own == 10);
}

TEST_CASE("the rank elsewhere comes first; the ranks waiting in torch.distributed are one group") {
  const StacksSample s = straggler();
  const auto groups = group_profiles(s.ranks);
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].size() == 1);
  CHECK(s.ranks[groups[0][0]].rank == 1);
  CHECK(groups[1].size() == 3);
  const std::string text = render_sample_text(s);
  INFO(text);
  CHECK(text.find("sampled run r1 for 1.0 s: 10 rounds, one every 100 ms; 4 ranks in 2 groups") == 0);
  CHECK(text.find("rank 1: 60% in load_batch (data.py:1") != std::string::npos);
  CHECK(text.find("ranks 0,2-3: 100% in all_reduce (distributed_c10d.py:3252)") != std::string::npos);
  // Rank 1's part comes before rank 0's, its shares in columns with the caller.
  const auto one = text.find("rank 1 (node 0, pid 101): 10 of 10 samples");
  const auto zero = text.find("rank 0 (node 0, pid 100)");
  REQUIRE(one != std::string::npos);
  REQUIRE(zero != std::string::npos);
  CHECK(one < zero);
  CHECK(text.find("60%    60%  /x/data.py:1") != std::string::npos);
  CHECK(text.find("<- /x/train.py:16 in main") != std::string::npos);
}

TEST_CASE("a rank that exits or never answers is said as such, and is not counted as sampled") {
  StacksSampler sampler;
  RankStacks gone;
  gone.rank = 1;
  gone.pid = 101;
  gone.status = "exited";
  RankStacks silent;
  silent.rank = 2;
  silent.pid = 102;
  silent.status = "no answer within 3 s";
  for (int i = 0; i < 3; ++i) sampler.add(snap({rank_at(0, kStep), gone, silent}));
  auto s = sampler.result();
  s.run_id = "r1";
  REQUIRE(s.ranks.size() == 3);
  CHECK(s.ranks[1].asked == 0);
  CHECK(s.ranks[1].answered == 0);
  CHECK(s.ranks[2].asked == 3);
  CHECK(s.ranks[2].answered == 0);
  const std::string text = render_sample_text(s);
  INFO(text);
  CHECK(text.find("rank 1 (node 0, pid 101): had exited") != std::string::npos);
  CHECK(text.find("rank 2 (node 0, pid 102): gave no answer within 3 s") != std::string::npos);
  CHECK(text.find("rank 0: 100% in step (train.py:20)") != std::string::npos);
}

TEST_CASE("the sample as JSON: groups, and per rank every function with its shares and its CPU") {
  StacksSample s = straggler();
  s.ranks[1].cpu_percent = 99.5;
  const auto v = JsonValue::parse(render_sample_json(s));
  CHECK(v["run_id"].str() == "r1");
  CHECK(v["rounds"].integer() == 10);
  CHECK(v["interval_ms"].integer() == 100);
  REQUIRE(v["groups"].size() == 2);
  CHECK(v["groups"][0]["ranges"].str() == "1");
  CHECK(v["groups"][0]["function"].str() == "load_batch");
  CHECK(v["groups"][1]["ranges"].str() == "0,2-3");
  const auto& one = v["ranks"][1];
  CHECK(one["rank"].integer() == 1);
  CHECK(one["cpu_percent"].num() == doctest::Approx(99.5));
  CHECK(v["ranks"][0]["cpu_percent"].is_null());
  CHECK(one["functions"][0]["function"].str() == "load_batch");
  CHECK(one["functions"][0]["own_share"].num() == doctest::Approx(0.6));
  CHECK(one["functions"][2]["total_share"].num() == doctest::Approx(1.0));
}

TEST_CASE("shares as a user reads them") {
  CHECK(percent_text(0, 10) == "0%");
  CHECK(percent_text(1, 1000) == "<1%");
  CHECK(percent_text(6, 10) == "60%");
  CHECK(percent_text(3, 0) == "0%");
}
