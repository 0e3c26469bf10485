#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launch/output/log_stream.hpp"

using namespace airhost::detail;

namespace {
struct Collected {
  std::vector<std::pair<std::string, bool>> lines;
  LineSplitter::Emit emit() {
    return [this](std::string_view l, bool complete) { lines.emplace_back(std::string(l), complete); };
  }
};
}  // namespace

TEST_CASE("lines are split at newlines however the bytes arrive") {
  const std::string text = "alpha\nbeta\n\ngamma\n";
  for (std::size_t chunk : {1u, 2u, 3u, 100u}) {
    LineSplitter s;
    Collected c;
    for (std::size_t at = 0; at < text.size(); at += chunk) s.feed(std::string_view(text).substr(at, chunk), c.emit());
    s.finish(c.emit());
    REQUIRE(c.lines.size() == 4);
    CHECK(c.lines[0].first == "alpha");
    CHECK(c.lines[2].first.empty());
    CHECK(c.lines[3].first == "gamma");
  }
}

TEST_CASE("a last line without newline is flushed at EOF") {
  LineSplitter s;
  Collected c;
  s.feed("done\npartial", c.emit());
  CHECK(c.lines.size() == 1);
  s.finish(c.emit());
  REQUIRE(c.lines.size() == 2);
  CHECK(c.lines[1].first == "partial");
  CHECK(c.lines[1].second);
}

TEST_CASE("a line longer than the limit comes out in pieces that add up to it") {
  LineSplitter s(10);
  Collected c;
  const std::string big(35, 'x');
  s.feed(big.substr(0, 12), c.emit());
  s.feed(big.substr(12) + "\nnext\n", c.emit());
  std::string joined;
  for (auto& [l, complete] : c.lines) {
    CHECK(l.size() <= 10);
    if (l != "next") joined += l;
  }
  CHECK(joined == big);
  CHECK(c.lines.back().first == "next");
  CHECK_FALSE(c.lines.front().second);  // a piece is marked incomplete
}

TEST_CASE("a line of exactly the limit is one complete line") {
  LineSplitter s(4);
  Collected c;
  s.feed("abcd", c.emit());
  s.feed("\n", c.emit());
  REQUIRE(c.lines.size() == 1);
  CHECK(c.lines[0] == std::make_pair(std::string("abcd"), true));
}

TEST_CASE("bytes that are not UTF-8 pass through the splitter and into the log unchanged") {
  char dir[] = "/tmp/airhost-logtest-XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string path = std::string(dir) + "/rank-0.stdout.log";
  const std::string bytes("\xff\xfe\x00 raw\ntail", 12);
  std::vector<std::string> lines;
  std::string shown;
  {
    RankStream stream(path, 1 << 20, 150, [&](std::string_view l) { lines.emplace_back(l); },
                      [&](const ConsoleEvent& e) { if (e.kind == ConsoleEvent::Kind::text) shown += e.text; });
    stream.feed(bytes, 0);
    stream.finish();
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream got;
  got << in.rdbuf();
  CHECK(got.str() == bytes);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == std::string("\xff\xfe\x00 raw", 7));
  CHECK(lines[1] == "tail");
  CHECK(shown == std::string("\xff\xfe\x00 rawtail", 11));
  std::system((std::string("rm -rf ") + dir).c_str());
}


// ---- what the console shows, as it comes ---------------------------------------------------

namespace {

// The events of a LiveSplitter as a string: text as it is, a redraw as <R>, a line end as <E>;
// each call's events between | so that what went out together is seen together.
struct Shown {
  std::string seen;
  LiveSplitter::Emit emit() {
    return [this](const ConsoleEvent& e) {
      switch (e.kind) {
        case ConsoleEvent::Kind::text: seen += std::string(e.text); break;
        case ConsoleEvent::Kind::redraw: seen += "<R>"; break;
        case ConsoleEvent::Kind::end: seen += "<E>"; break;
      }
    };
  }
  // What came out since the last call.
  std::string take() { return std::exchange(seen, std::string()); }
};

constexpr std::uint64_t kQuiet = 150;

}  // namespace

TEST_CASE("whole lines go out at their newline, in one piece, however the bytes arrive") {
  const std::string text = "alpha\nbeta\n\ngamma\n";
  for (std::size_t chunk : {1u, 2u, 5u, 100u}) {
    LiveSplitter s(1 << 20, kQuiet);
    Shown out;
    std::vector<std::string> pieces;
    for (std::size_t at = 0; at < text.size(); at += chunk) {
      s.feed(std::string_view(text).substr(at, chunk), at, out.emit());
      if (auto got = out.take(); !got.empty()) pieces.push_back(got);
    }
    std::string joined;
    for (auto& p : pieces) {
      CHECK(p.size() >= 3);
      CHECK(p.substr(p.size() - 3) == "<E>");  // nothing goes out but whole lines
      joined += p;
    }
    CHECK(joined == "alpha<E>beta<E><E>gamma<E>");
    CHECK(s.deadline() == LiveSplitter::kNever);
  }
}

TEST_CASE("a partial line is shown when its quiet spell is over, and the rest of it at once") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  s.feed("Password: ", 1000, out.emit());
  CHECK(out.take().empty());
  CHECK(s.deadline() == 1000 + kQuiet);
  s.feed("still ", 1100, out.emit());  // the spell counts from the first byte held: a line
  CHECK(s.deadline() == 1000 + kQuiet);  // dribbled out byte by byte is shown all the same
  s.tick(1000 + kQuiet - 1, out.emit());
  CHECK(out.take().empty());
  s.tick(1000 + kQuiet, out.emit());
  CHECK(out.take() == "Password: still ");
  CHECK(s.deadline() == LiveSplitter::kNever);
  s.feed("typing", 2000, out.emit());
  CHECK(out.take() == "typing");  // the line is on the console already: no new wait
  s.feed(" done\nnext", 2001, out.emit());
  CHECK(out.take() == " done<E>");
  CHECK(s.deadline() == 2001 + kQuiet);  // a new line is held again
}

TEST_CASE("a long line in transit is held longer than a prompt before it is shown") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  const std::string first_pipe_full(64 * 1024, 'x');  // its writer waits for the pipe to drain
  s.feed(first_pipe_full, 1000, out.emit());
  CHECK(s.deadline() == 1000 + LiveSplitter::kInTransitMs);
  s.tick(1000 + kQuiet, out.emit());
  CHECK(out.take().empty());
  s.feed("rest\n", 1000 + 900, out.emit());  // a busy machine gave the writer the CPU late
  CHECK(out.take() == first_pipe_full + "rest<E>");  // whole all the same
  s.feed(std::string(LiveSplitter::kInTransitBytes, 'y'), 5000, out.emit());
  s.tick(5000 + LiveSplitter::kInTransitMs, out.emit());
  CHECK(out.take() == std::string(LiveSplitter::kInTransitBytes, 'y'));  // but not forever
}

TEST_CASE("a line whose writer still runs is held on, up to kInTransitMs from its first byte") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  CHECK_FALSE(s.extend(1000));  // nothing held: nothing to extend
  s.feed("0 o 17 aaaa", 1000, out.emit());
  CHECK(s.extend(1000 + kQuiet));  // quiet spell over, but its writer is running
  CHECK(s.deadline() == 1000 + 2 * kQuiet);
  s.tick(1000 + kQuiet, out.emit());
  CHECK(out.take().empty());
  s.feed("aa|0o17\n", 1000 + 2 * kQuiet - 1, out.emit());
  CHECK(out.take() == "0 o 17 aaaaaa|0o17<E>");  // whole
  s.feed("Epoch 1: ", 5000, out.emit());
  std::uint64_t now = 5000 + kQuiet;
  while (s.extend(now)) now = s.deadline();  // a rank computing after print(end="")
  CHECK(now >= 5000 + LiveSplitter::kInTransitMs);
  CHECK(now < 5000 + LiveSplitter::kInTransitMs + kQuiet);
  s.tick(now, out.emit());
  CHECK(out.take() == "Epoch 1: ");  // shown at last
}

TEST_CASE("a line held while the host did not read its rank gets a new quiet spell") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  s.postpone(500);  // nothing held: nothing changes
  CHECK(s.deadline() == LiveSplitter::kNever);
  s.feed("half a li", 1000, out.emit());
  s.postpone(4000);  // the console reader was behind from 1000 to 4000
  CHECK(s.deadline() == 4000 + kQuiet);
  s.feed("ne\n", 4001, out.emit());
  CHECK(out.take() == "half a line<E>");
}

TEST_CASE("a carriage-return redraw goes out at once, and its line with it") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  s.feed("\r  0%|          | 0/3", 0, out.emit());
  CHECK(out.take() == "<R>  0%|          | 0/3");
  s.feed("\r 33%|###       | 1/3", 100, out.emit());
  CHECK(out.take() == "<R> 33%|###       | 1/3");
  s.feed("\r100%|##########| 3/3\n", 200, out.emit());
  CHECK(out.take() == "<R>100%|##########| 3/3<E>");
  CHECK(s.deadline() == LiveSplitter::kNever);
}

TEST_CASE("what was held before a redraw goes out with it") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  s.feed("Epoch 1: ", 0, out.emit());
  CHECK(out.take().empty());
  s.feed("\r50%", 10, out.emit());
  CHECK(out.take() == "Epoch 1: <R>50%");
}

TEST_CASE("a carriage return at the end of a read waits for the next byte to tell what it is") {
  SUBCASE("print(..., end='\\r'): a redraw") {
    LiveSplitter s(1 << 20, kQuiet);
    Shown out;
    s.feed("step 1\r", 0, out.emit());
    CHECK(out.take().empty());  // nothing yet: "step 1" is held, the '\r' pending
    s.feed("step 2\r", 10, out.emit());
    CHECK(out.take() == "step 1<R>step 2");
    s.feed("\n", 20, out.emit());
    CHECK(out.take() == "\r<E>");  // "\r\n": part of the line, as the log has it
  }
  SUBCASE("\\r\\n cut between two reads: one line end, no redraw") {
    LiveSplitter s(1 << 20, kQuiet);
    Shown out;
    s.feed("dos line\r", 0, out.emit());
    s.feed("\nnext\r\n", 1, out.emit());
    CHECK(out.take() == "dos line\r<E>next\r<E>");
  }
  SUBCASE("at EOF") {
    LiveSplitter s(1 << 20, kQuiet);
    Shown out;
    s.feed("last\r", 0, out.emit());
    s.finish(out.emit());
    CHECK(out.take() == "last\r<E>");
  }
}

TEST_CASE("a line longer than the limit is shown without waiting, and continues") {
  LiveSplitter s(10, kQuiet);
  Shown out;
  s.feed("0123", 0, out.emit());
  CHECK(out.take().empty());
  s.feed("456789abc", 1, out.emit());
  CHECK(out.take() == "0123456789abc");
  s.feed("def\n", 2, out.emit());
  CHECK(out.take() == "def<E>");
}

TEST_CASE("at EOF an unfinished line is shown and ended; a finished one is left alone") {
  LiveSplitter s(1 << 20, kQuiet);
  Shown out;
  s.feed("done\n", 0, out.emit());
  out.take();
  s.finish(out.emit());
  CHECK(out.take().empty());
  s.feed("half", 1, out.emit());
  s.finish(out.emit());
  CHECK(out.take() == "half<E>");
}

TEST_CASE("however one rank's stream is cut and timed, alone it shows each line once, prefixed") {
  // The console bytes of one rank alone equal its bytes with the prefix at every line start
  // and a '\r' redraw drawn after the prefix again: the quiet spells only change when.
  const std::string text = "one\ntwo without end \r 10%\r 20%\nprompt> answer\n\nlast";
  const std::string expected = "[rank 0] one\n[rank 0] two without end \r[rank 0]  10%\r[rank 0]  20%\n"
                               "[rank 0] prompt> answer\n[rank 0] \n[rank 0] last\n";
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    LiveSplitter s(1 << 20, kQuiet);
    Console console(false);
    auto emit = [&](const ConsoleEvent& e) { console.show(0, airhost::Stream::out, "[rank 0] ", e); };
    std::uint64_t now = 0;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t n = 1 + rng() % 6;
      s.feed(std::string_view(text).substr(at, n), now, emit);
      at += n;
      now += rng() % 200;
      s.tick(now, emit);
    }
    s.finish(emit);
    std::string got;
    for (auto& [stream, bytes] : console.pending()) got += bytes;
    CHECK(got == expected);
  }
}

namespace {

// What a Console wrote, each stream's bytes tagged: "out:" or "err:" before each run.
std::string written(const Console& c) {
  std::string s;
  for (auto& [stream, bytes] : c.pending()) s += (stream == airhost::Stream::out ? "out:" : "err:") + bytes;
  return s;
}

ConsoleEvent text(std::string_view t) { return {ConsoleEvent::Kind::text, t}; }
const ConsoleEvent kRedraw{ConsoleEvent::Kind::redraw, {}};
const ConsoleEvent kEnd{ConsoleEvent::Kind::end, {}};

}  // namespace

TEST_CASE("another rank's line ends an open line first, and the rest of it is named again") {
  using airhost::Stream;
  Console c(false);
  c.show(0, Stream::out, "[rank 0] ", text("Loading"));
  c.show(1, Stream::out, "[rank 1] ", text("ready"));
  c.show(1, Stream::out, "[rank 1] ", kEnd);
  c.show(0, Stream::out, "[rank 0] ", text("... done"));
  c.show(0, Stream::out, "[rank 0] ", kEnd);
  CHECK(written(c) == "out:[rank 0] Loading\n[rank 1] ready\n[rank 0] ... done\n");
}

TEST_CASE("a line cut by another rank's that then ends with nothing more leaves no empty line") {
  // CI, 3 workers on 2 cores: a rank's last line (no '\n') was shown after its quiet spell, cut
  // by another rank's line, then ended at EOF: the console showed an empty "[rank 3] " line.
  using airhost::Stream;
  Console c(false);
  c.show(3, Stream::out, "[rank 3] ", text("3 o 217848 dddd|3o217848"));
  c.show(1, Stream::out, "[rank 1] ", text("1 o 9"));
  c.show(1, Stream::out, "[rank 1] ", kEnd);
  c.show(3, Stream::out, "[rank 3] ", kEnd);  // EOF: the line ends, nothing more of it came
  c.show(0, Stream::out, "[rank 0] ", kEnd);  // an empty line of the rank's own is shown
  CHECK(written(c) == "out:[rank 3] 3 o 217848 dddd|3o217848\n[rank 1] 1 o 9\n[rank 0] \n");
  c.clear_pending();
  c.show(2, Stream::err, "[rank 2] ", text("Password: "));
  c.end_open_lines();  // a host note
  c.show(2, Stream::err, "[rank 2] ", kEnd);
  c.show(2, Stream::err, "[rank 2] ", kEnd);  // then an empty line of its own
  CHECK(written(c) == "err:[rank 2] Password: \n[rank 2] \n");
}

TEST_CASE("two ranks' bars take turns on lines of their own, each line named by its rank") {
  using airhost::Stream;
  Console c(false);
  c.show(0, Stream::err, "[rank 0] ", kRedraw);
  c.show(0, Stream::err, "[rank 0] ", text(" 10%"));
  c.show(0, Stream::err, "[rank 0] ", kRedraw);
  c.show(0, Stream::err, "[rank 0] ", text(" 20%"));
  c.show(1, Stream::err, "[rank 1] ", kRedraw);
  c.show(1, Stream::err, "[rank 1] ", text(" 10%"));
  c.show(0, Stream::err, "[rank 0] ", kRedraw);
  c.show(0, Stream::err, "[rank 0] ", text(" 30%"));
  CHECK(written(c) == "err:[rank 0]  10%\r[rank 0]  20%\n[rank 1]  10%\n[rank 0]  30%");
}

TEST_CASE("a host note written past the console finds every open line ended") {
  using airhost::Stream;
  Console c(false);
  c.show(0, Stream::out, "[rank 0] ", text("Password: "));
  c.show(1, Stream::err, "[rank 1] ", kRedraw);
  c.show(1, Stream::err, "[rank 1] ", text("50%"));
  c.end_open_lines();
  c.show(1, Stream::err, "[rank 1] ", kRedraw);
  c.show(1, Stream::err, "[rank 1] ", text("60%"));
  CHECK(written(c) == "out:[rank 0] Password: err:[rank 1] 50%out:\nerr:\n[rank 1] 60%");
}

TEST_CASE("stdout and stderr on one screen share its open line; on two, each keeps its own") {
  using airhost::Stream;
  auto play = [](Console& c) {
    c.show(0, Stream::err, "[rank 0] ", kRedraw);
    c.show(0, Stream::err, "[rank 0] ", text(" 50%"));
    c.show(0, Stream::out, "[rank 0] ", text("loss 0.3"));
    c.show(0, Stream::out, "[rank 0] ", kEnd);
    c.show(0, Stream::err, "[rank 0] ", kRedraw);
    c.show(0, Stream::err, "[rank 0] ", text(" 60%"));
  };
  Console one_screen(true);
  play(one_screen);
  CHECK(written(one_screen) == "err:[rank 0]  50%\nout:[rank 0] loss 0.3\nerr:[rank 0]  60%");
  Console two_screens(false);
  play(two_screens);
  CHECK(written(two_screens) == "err:[rank 0]  50%out:[rank 0] loss 0.3\nerr:\r[rank 0]  60%");
}

TEST_CASE("without prefixes a redraw is a bare carriage return, and lines still never mix") {
  using airhost::Stream;
  Console c(false);
  c.show(0, Stream::out, "", text("a"));
  c.show(0, Stream::out, "", kRedraw);
  c.show(0, Stream::out, "", text("b"));
  c.show(1, Stream::out, "", kEnd);
  CHECK(written(c) == "out:a\rb\n\n");
  c.clear_pending();
  CHECK(c.pending().empty());
  CHECK(c.pending_bytes() == 0);
  c.show(0, Stream::err, "", text("e"));  // the runs' buffers are reused: nothing old comes back
  c.show(0, Stream::out, "", text("o"));
  CHECK(written(c) == "err:eout:o");  // two screens: the open err line stays open
  CHECK(c.pending_bytes() == 2);
}

TEST_CASE("a host note gets a line of its own on the console and never enters the rank's log or lines") {
  // Issue 22: a note used to land in the rank's raw log, glued to its unfinished line (a bar).
  char dir[] = "/tmp/airhost-logtest-XXXXXX";
  REQUIRE(mkdtemp(dir));
  const std::string path = std::string(dir) + "/rank-0.stderr.log";
  Console console(false);
  std::vector<std::string> lines;
  {
    RankStream stream(path, 1 << 20, kQuiet, [&](std::string_view l) { lines.emplace_back(l); },
                      [&](const ConsoleEvent& e) { console.show(0, airhost::Stream::err, "[rank 0] ", e); });
    stream.feed("half a line", 0);
    stream.show_line("airhost: a note");
    stream.feed(" and its end\n", 1);
    stream.finish();
  }
  CHECK(written(console) == "err:[rank 0] half a line\n[rank 0] airhost: a note\n[rank 0]  and its end\n");
  CHECK(lines == std::vector<std::string>{"half a line and its end"});
  std::ifstream in(path, std::ios::binary);
  std::stringstream got;
  got << in.rdbuf();
  CHECK(got.str() == "half a line and its end\n");
  std::system((std::string("rm -rf ") + dir).c_str());
}
