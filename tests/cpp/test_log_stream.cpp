#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "launch/log_stream.hpp"

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
  {
    RankStream stream(path, 1 << 20, [&](std::string_view l) { lines.emplace_back(l); });
    stream.feed(bytes);
    stream.finish();
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream got;
  got << in.rdbuf();
  CHECK(got.str() == bytes);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == std::string("\xff\xfe\x00 raw", 7));
  CHECK(lines[1] == "tail");
  std::system((std::string("rm -rf ") + dir).c_str());
}

TEST_CASE("the prefix names the rank") { CHECK(rank_prefix(3) == "[rank 3] "); }
