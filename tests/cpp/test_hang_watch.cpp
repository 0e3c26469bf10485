// test_hang_watch.cpp — when the hang watch calls a run hung (no rank's stack moved, no rank
// burned CPU outside torch.distributed, for hang_timeout), and the report's first line.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launch/watch/hang_watch.hpp"

using namespace airhost::detail;
using std::chrono::milliseconds;

namespace {

HangSample at(int rank, const std::string& where, std::uint64_t cpu, bool collective = false) {
  HangSample s;
  s.rank = rank;
  s.where = where;
  s.cpu = cpu;
  s.in_collective = collective;
  return s;
}

RankStacks rank_in(int rank, std::vector<StackFrame> frames) {
  RankStacks r;
  r.rank = rank;
  r.pid = 100 + rank;
  r.answered = true;
  ThreadStack t;
  t.main = true;
  t.frames = std::move(frames);
  r.threads.push_back(t);
  return r;
}

const StackFrame kAllReduce{"/v/torch/distributed/distributed_c10d.py", 3252, "all_reduce"};
const StackFrame kWrapper{"/v/torch/distributed/c10d_logger.py", 81, "wrapper"};
const StackFrame kMain{"/x/train.py", 18, "main"};
const StackFrame kWait{"/x/data.py", 6, "wait_for_data"};

}  // namespace

TEST_CASE("the sample interval is a sixth of the timeout, between 1 and 60 s") {
  CHECK(hang_sample_every(milliseconds(3000)) == milliseconds(1000));
  CHECK(hang_sample_every(milliseconds(60000)) == milliseconds(10000));
  CHECK(hang_sample_every(milliseconds(30 * 60 * 1000)) == milliseconds(60000));
}

TEST_CASE("a run is hung once no rank made progress for the timeout, reported once per stall") {
  HangWatch w(milliseconds(10000));
  const std::vector<HangSample> still = {at(0, "all_reduce", 50, true), at(1, "wait_for_data", 20)};
  CHECK_FALSE(w.feed(0, still));
  CHECK_FALSE(w.feed(5, still));
  CHECK(w.still_for(5) == doctest::Approx(5));
  CHECK(w.feed(10, still));        // 10 s without progress
  CHECK_FALSE(w.feed(15, still));  // said once
  // Progress (rank 1's stack moves), then a new stall: reported again.
  CHECK_FALSE(w.feed(16, {at(0, "all_reduce", 50, true), at(1, "train_step", 30)}));
  CHECK_FALSE(w.feed(20, {at(0, "all_reduce", 50, true), at(1, "train_step", 30)}));
  CHECK(w.feed(26, {at(0, "all_reduce", 50, true), at(1, "train_step", 30)}));
}

TEST_CASE("CPU time is progress outside torch.distributed, not while a rank spins in a collective") {
  HangWatch w(milliseconds(2000));
  // Rank 1 computes in one frame (a long matmul): its stack stands, its CPU time grows.
  CHECK_FALSE(w.feed(0, {at(0, "all_reduce", 5, true), at(1, "matmul", 100)}));
  CHECK_FALSE(w.feed(2, {at(0, "all_reduce", 5, true), at(1, "matmul", 300)}));
  CHECK_FALSE(w.feed(4, {at(0, "all_reduce", 5, true), at(1, "matmul", 500)}));
  // Every rank in a collective, burning CPU (spinning): no progress.
  HangWatch spin(milliseconds(2000));
  CHECK_FALSE(spin.feed(0, {at(0, "all_reduce", 5, true), at(1, "barrier", 100, true)}));
  CHECK_FALSE(spin.feed(1, {at(0, "all_reduce", 105, true), at(1, "barrier", 200, true)}));
  CHECK(spin.feed(2, {at(0, "all_reduce", 205, true), at(1, "barrier", 300, true)}));
}

TEST_CASE("a stuck rank whose library threads tick over (gloo polls every 10 ms) is still hung") {
  // 100 ticks a second; rank 1 uses about 1 tick a second (under 5% of a core): no progress.
  HangWatch w(milliseconds(3000), 100);
  CHECK_FALSE(w.feed(0, {at(0, "all_reduce", 5, true), at(1, "wait_for_data", 100)}));
  CHECK_FALSE(w.feed(1, {at(0, "all_reduce", 6, true), at(1, "wait_for_data", 101)}));
  CHECK_FALSE(w.feed(2, {at(0, "all_reduce", 7, true), at(1, "wait_for_data", 103)}));
  CHECK(w.feed(3, {at(0, "all_reduce", 8, true), at(1, "wait_for_data", 104)}));
  // The same rank using 5% of a core (5 ticks a second) made progress.
  HangWatch busy(milliseconds(3000), 100);
  CHECK_FALSE(busy.feed(0, {at(1, "wait_for_data", 100)}));
  CHECK_FALSE(busy.feed(1, {at(1, "wait_for_data", 105)}));
  CHECK_FALSE(busy.feed(2, {at(1, "wait_for_data", 110)}));
  CHECK_FALSE(busy.feed(3, {at(1, "wait_for_data", 115)}));
  CHECK_FALSE(busy.feed(4, {at(1, "wait_for_data", 120)}));
  // With a minute between samples the bar is 3 s of CPU: a minute of polling threads stays under it.
  HangWatch slow(milliseconds(6 * 60000), 100);
  CHECK_FALSE(slow.feed(0, {at(1, "wait_for_data", 1000)}));
  CHECK(slow.wants_stack(1, 1060, 60));
  CHECK_FALSE(slow.wants_stack(1, 1300, 60));
}

TEST_CASE("an exited rank holds nothing; a rank that starts is progress") {
  HangWatch w(milliseconds(2000));
  HangSample gone = at(1, "", 0);
  gone.alive = false;
  CHECK_FALSE(w.feed(0, {at(0, "x", 1)}));
  CHECK_FALSE(w.feed(1, {at(0, "x", 1), at(1, "y", 1)}));  // rank 1 appeared
  CHECK_FALSE(w.feed(2, {at(0, "x", 1), gone}));
  CHECK(w.feed(3, {at(0, "x", 1), gone}));
}

TEST_CASE("the report names the rank that is elsewhere and what the others wait in") {
  StacksSnapshot snap;
  snap.ranks = {rank_in(0, {kAllReduce, kWrapper, kMain}), rank_in(1, {kWait, kMain}),
                rank_in(2, {kAllReduce, kWrapper, kMain}), rank_in(3, {kAllReduce, kWrapper, kMain})};
  CHECK(hang_headline(snap, 1800, milliseconds(1800 * 1000)) ==
        "no rank has made progress for 1800 s (hang_timeout 1800 s): rank 1 is elsewhere, at /x/data.py:6 in "
        "wait_for_data, while ranks 0,2-3 wait in all_reduce");
  CHECK(hang_sample(snap.ranks[0]).in_collective);
  CHECK_FALSE(hang_sample(snap.ranks[1]).in_collective);

  StacksSnapshot mismatch;
  mismatch.ranks = {rank_in(0, {kAllReduce, kMain}),
                    rank_in(1, {{"/v/torch/distributed/distributed_c10d.py", 4100, "barrier"}, kMain})};
  CHECK(hang_headline(mismatch, 60, milliseconds(60000)) ==
        "no rank has made progress for 60 s (hang_timeout 60 s): every rank waits in torch.distributed, not all "
        "in the same call: rank 0 waits in all_reduce and rank 1 in barrier");

  StacksSnapshot silent;
  silent.ranks = {rank_in(0, {kWait, kMain}), RankStacks{}};
  silent.ranks[1].rank = 1;
  silent.ranks[1].status = "no answer within 3 s";
  CHECK(hang_headline(silent, 60, milliseconds(60000)) ==
        "no rank has made progress for 60 s (hang_timeout 60 s): rank 0 is at /x/data.py:6 in wait_for_data; "
        "rank 1 did not answer (see /proc state below)");
}

TEST_CASE("only a rank that stood still or waits in a collective is asked for its stack") {
  HangWatch w(milliseconds(2000));
  CHECK_FALSE(w.wants_stack(0, 120, 0));  // busy since it started: progress, no signal needed
  CHECK(w.wants_stack(0, 0, 0));
  CHECK_FALSE(w.feed(0, {at(0, "train_step", 100), at(1, "all_reduce", 10, true)}));
  CHECK_FALSE(w.wants_stack(0, 150, 1));  // burned CPU outside torch.distributed
  CHECK(w.wants_stack(0, 100, 1));        // stood still: has its stack moved?
  CHECK(w.wants_stack(0, 102, 1));        // a tick or two: its library threads, not progress
  CHECK(w.wants_stack(1, 40, 1));         // in a collective, spinning or not
  const HangSample carried = w.carried(0, 150);
  CHECK(carried.where == "train_step");
  CHECK(carried.cpu == 150);
  CHECK_FALSE(w.feed(1, {carried, at(1, "all_reduce", 10, true)}));
  CHECK_FALSE(w.feed(3, {w.carried(0, 200), at(1, "all_reduce", 10, true)}));  // still progressing
}
