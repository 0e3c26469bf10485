// test_stacks.cpp — the dump a rank writes (faulthandler's format between airhost's header and
// end line) read back, idle threads, rank ranges, the grouping (odd ones out first) and the
// text and JSON a user gets.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/json_value.hpp"
#include "launch/rank/frames.hpp"
#include "launch/watch/stacks.hpp"

using namespace airhost::detail;

namespace {

// 0x1000 is the main thread (listed last, as CPython does); 0x2000 a worker in train.py;
// 0x3000 a thread waiting on a queue; 0x4000 a thread with no Python frame.
std::string dump(unsigned seq, const std::string& main_frames) {
  return "airhost-stacks seq=" + std::to_string(seq) + " pid=77 main=4096\n"
         "Thread 0x0000000000004000 (most recent call first):\n"
         "  <no Python frame>\n"
         "\n"
         "Thread 0x0000000000003000 (most recent call first):\n"
         "  File \"/usr/lib/python3.11/queue.py\", line 171 in get\n"
         "  File \"/x/worker.py\", line 5 in run\n"
         "\n"
         "Current thread 0x0000000000002000 (most recent call first):\n"
         "  File \"/x/train.py\", line 9 in prefetch\n"
         "\n"
         "Thread 0x0000000000001000 (most recent call first):\n" +
         main_frames + "airhost-stacks-end seq=" + std::to_string(seq) + "\n";
}

const std::string kAllReduce =
    "  File \"/v/torch/distributed/distributed_c10d.py\", line 3252 in all_reduce\n"
    "  File \"/x/train.py\", line 18 in main\n";
const std::string kLoadBatch =
    "  File \"/x/data \"q\".py\", line 6 in load_batch\n"
    "  File \"/x/train.py\", line 16 in main\n";

RankStacks rank_with(int rank, const std::string& frames) {
  auto r = parse_dump(dump(1, frames), 1);
  REQUIRE(r);
  r->rank = rank;
  r->pid = 100 + rank;
  return *r;
}

}  // namespace

TEST_CASE("a dump is read back: threads, frames innermost first, the main thread first") {
  auto r = parse_dump(dump(7, kLoadBatch), 7);
  REQUIRE(r);
  CHECK(r->answered);
  CHECK(r->pid == 77);
  REQUIRE(r->threads.size() == 4);
  const ThreadStack& main = r->threads[0];
  CHECK(main.main);
  CHECK(main.id == 0x1000);
  REQUIRE(main.frames.size() == 2);
  CHECK(main.frames[0].file == "/x/data \"q\".py");  // a quote in the name does not cut it
  CHECK(main.frames[0].line == 6);
  CHECK(main.frames[0].function == "load_batch");
  CHECK(where_text(main) == "/x/data \"q\".py:6 in load_batch");
  CHECK(r->threads[3].current);  // the order of the others is CPython's
  CHECK(r->threads[1].frames.empty());
}

TEST_CASE("a dump of another request, or one still being written, is not an answer") {
  CHECK_FALSE(parse_dump(dump(6, kLoadBatch), 7));
  std::string half = dump(7, kLoadBatch);
  half.resize(half.find("airhost-stacks-end"));
  CHECK_FALSE(parse_dump(half, 7));
  CHECK_FALSE(parse_dump("", 7));
}

TEST_CASE("CPython's own words are kept: an error instead of stacks, a cut stack, an unknown line") {
  auto r = parse_dump("airhost-stacks seq=1 pid=5 main=1\nerror: unable to get the current thread state\n"
                      "airhost-stacks-end seq=1\n", 1);
  REQUIRE(r);
  CHECK(r->error == "unable to get the current thread state");
  CHECK(r->threads.empty());
  r = parse_dump("airhost-stacks seq=1 pid=5 main=1\nThread 0x1 (most recent call first):\n"
                 "  File \"a.py\", line ??? in f\n  ...\nairhost-stacks-end seq=1\n", 1);
  REQUIRE(r);
  REQUIRE(r->threads.size() == 1);
  CHECK(r->threads[0].truncated);
  CHECK(r->threads[0].frames[0].line == -1);
  CHECK(frame_text(r->threads[0].frames[0]) == "a.py:? in f");
}

TEST_CASE("idle threads: no Python frame, or waiting in threading, queue or selectors; never the main thread") {
  auto r = parse_dump(dump(1, kAllReduce), 1);
  REQUIRE(r);
  CHECK_FALSE(is_idle(r->threads[0]));  // main
  CHECK(is_idle(r->threads[1]));        // no Python frame
  CHECK(is_idle(r->threads[2]));        // queue.get
  CHECK_FALSE(is_idle(r->threads[3]));  // prefetch in train.py
  ThreadStack main_without_frames;
  main_without_frames.main = true;
  CHECK_FALSE(is_idle(main_without_frames));
}

TEST_CASE("rank ranges are compact") {
  CHECK(rank_ranges({0, 2, 3, 4, 5, 6, 7}) == "0,2-7");
  CHECK(rank_ranges({7, 0, 3, 2}) == "0,2-3,7");
  CHECK(rank_ranges({5}) == "5");
  CHECK(rank_ranges({1, 1, 2}) == "1-2");
  CHECK(rank_ranges({}) == "");
}

TEST_CASE("ranks group by where their main thread stands, the odd ones out first") {
  std::vector<RankStacks> ranks;
  for (int i = 0; i < 8; ++i) ranks.push_back(rank_with(i, i == 1 ? kLoadBatch : kAllReduce));
  RankStacks silent;
  silent.rank = 8;
  silent.pid = 108;
  silent.status = "no answer within 3 s";
  silent.proc_state = "D (disk sleep)";
  silent.wchan = "io_schedule";
  ranks.push_back(silent);
  auto groups = group_ranks(ranks);
  REQUIRE(groups.size() == 3);
  CHECK(groups[0] == std::vector<std::size_t>{1});  // size 1, not waiting in torch.distributed
  CHECK(groups[1] == std::vector<std::size_t>{8});
  CHECK(groups[2].size() == 7);

  SUBCASE("two ranks, one each: the one the other waits for comes first") {
    auto two = group_ranks({rank_with(0, kAllReduce), rank_with(1, kLoadBatch)});
    REQUIRE(two.size() == 2);
    CHECK(two[0] == std::vector<std::size_t>{1});
  }

  SUBCASE("the text names each group's ranks, node, pids and frame, with the main thread's stack") {
    StacksSnapshot s{"run-1", 0, "/r/stacks/t.txt", ranks};
    const std::string text = render_text(s, false);
    CHECK(text.find("stacks of run run-1: 9 ranks in 3 groups, the odd ones out first; every thread in /r/stacks/t.txt\n") == 0);
    const auto odd = text.find("rank 1 (node 0, pid 101) is in /x/data \"q\".py:6 in load_batch\n");
    const auto stuck = text.find("rank 8 (node 0, pid 108) gave no answer within 3 s: state D (disk sleep), wchan io_schedule\n");
    const auto rest = text.find("ranks 0,2-7 (node 0, pids 100,102,103,104,105,106,107) are in "
                                "/v/torch/distributed/distributed_c10d.py:3252 in all_reduce\n");
    CHECK(odd != std::string::npos);
    CHECK(stuck != std::string::npos);
    CHECK(rest != std::string::npos);
    CHECK(odd < stuck);
    CHECK(stuck < rest);
    CHECK(text.find("    /x/train.py:16 in main\n") != std::string::npos);
    // The thread not idle is shown with its frame; the idle ones only with --all-threads.
    CHECK(text.find("  rank 1, thread 0x2000: /x/train.py:9 in prefetch\n") != std::string::npos);
    CHECK(text.find("queue.py") == std::string::npos);
    const std::string all = render_text(s, true);
    CHECK(all.find("  rank 1, thread 0x3000 (idle): /usr/lib/python3.11/queue.py:171 in get\n") != std::string::npos);
    CHECK(render_full(s).find("==== rank 8 (node 0, local rank 0, pid 108) gave no answer") != std::string::npos);
  }

  SUBCASE("the JSON holds the same as data") {
    StacksSnapshot s{"run-1", 12.5, "", ranks};
    const JsonValue v = JsonValue::parse(render_json(s));
    CHECK(v["run_id"].str() == "run-1");
    CHECK(v["file"].is_null());
    CHECK(v["groups"].size() == 3);
    CHECK(v["groups"][0]["ranges"].str() == "1");
    CHECK(v["groups"][0]["where"].str() == "/x/data \"q\".py:6 in load_batch");
    CHECK(v["groups"][2]["ranges"].str() == "0,2-7");
    CHECK(v["ranks"][8]["answered"].boolean() == false);
    CHECK(v["ranks"][8]["wchan"].str() == "io_schedule");
    CHECK(v["ranks"][1]["threads"][0]["main"].boolean());
    CHECK(v["ranks"][1]["threads"][0]["frames"][0]["function"].str() == "load_batch");
    CHECK(v["ranks"][1]["threads"][2]["idle"].boolean());
  }
}

TEST_CASE("ranks' stacks travel to node 0 whole, and an answer too large for a link frame is cut where it matters least") {
  RankStacks a;
  a.rank = 2, a.local_rank = 0, a.node = 1, a.pid = 4242, a.answered = true, a.cpu_ticks = 1234;
  ThreadStack main_t;
  main_t.id = 77, main_t.main = true;
  main_t.frames = {{"/x/train.py", 41, "load_batch"}, {"/x/train.py", 90, "<module>"}};
  ThreadStack idle;
  idle.id = 78;
  idle.frames = {{"/usr/lib/python3.11/threading.py", 320, "wait"}, {"/x/w.py", 5, "run"}};
  a.threads = {main_t, idle};
  RankStacks b;
  b.rank = 3, b.local_rank = 1, b.node = 1, b.pid = 4243, b.status = "no answer within 3 s";
  b.proc_state = "D (disk sleep)", b.wchan = "nfs_wait", b.error = "odd \"quoted\"\nline";

  const auto back = decode_rank_stacks(encode_rank_stacks({a, b}, 1 << 20));
  REQUIRE(back.size() == 2);
  CHECK(back[0].rank == 2);
  CHECK(back[0].pid == 4242);
  CHECK(back[0].answered);
  CHECK(back[0].cpu_ticks == 1234);
  REQUIRE(back[0].threads.size() == 2);
  CHECK(back[0].threads[0].main);
  CHECK(where_text(back[0].threads[0]) == "/x/train.py:41 in load_batch");
  CHECK(back[0].threads[1].frames.size() == 2);
  CHECK_FALSE(back[1].answered);
  CHECK(back[1].status == "no answer within 3 s");
  CHECK(back[1].proc_state == "D (disk sleep)");
  CHECK(back[1].wchan == "nfs_wait");
  CHECK(back[1].error == "odd \"quoted\"\nline");
  CHECK(back[1].cpu_ticks == -1);

  // A deep main stack on many threads: past the cap, idle threads lose their frames first,
  // then each stack keeps its innermost frames, marked truncated; the main thread's place stays.
  RankStacks deep = a;
  deep.threads[0].frames.assign(400, StackFrame{"/x/very/long/path/to/a/module/of/the/model.py", 7, "forward"});
  deep.threads[0].frames[0] = {"/x/train.py", 41, "load_batch"};
  const std::string whole = encode_rank_stacks({deep}, 1 << 20);
  const std::string cut = encode_rank_stacks({deep}, whole.size() / 4);
  CHECK(cut.size() <= whole.size() / 4);
  const auto small = decode_rank_stacks(cut);
  REQUIRE(small.size() == 1);
  CHECK(small[0].threads[0].truncated);
  CHECK(small[0].threads[0].frames.size() < 400);
  CHECK(where_text(small[0].threads[0]) == "/x/train.py:41 in load_batch");
  CHECK(small[0].threads[1].frames.empty());

  CHECK_THROWS_AS(decode_rank_stacks("not fields at all"), FrameError);
}
