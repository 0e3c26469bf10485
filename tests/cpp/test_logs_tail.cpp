// `airhost logs --tail N` finds where the last N lines begin by reading back from the end
// (issue 32, defect 5): the same answer as reading the whole file, at any block boundary, and
// in bounded memory and time on a 3 GiB log.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>

#include "cli/commands.hpp"
#include "support.hpp"

using airhost::detail::tail_offset;

namespace {

// The old way: the whole text in memory, scanned back from its end.
off_t tail_by_reading_it_all(const std::string& text, long lines) {
  if (lines == 0) return static_cast<off_t>(text.size());
  std::size_t pos = text.size();
  if (pos && text[pos - 1] == '\n') --pos;
  long seen = 0;
  while (pos > 0) {
    if (text[pos - 1] == '\n' && ++seen == lines) break;
    --pos;
  }
  return static_cast<off_t>(pos);
}

}  // namespace

TEST_CASE("the last N lines begin where reading the whole file says, across block boundaries") {
  airhost_test::TempDir dir;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    std::string text;
    const int lines = static_cast<int>(rng() % 400);
    for (int i = 0; i < lines; ++i) {
      // Lines of 0 to 3,000 bytes, some far longer than a block (64 KiB) now and then.
      const std::size_t len = rng() % 17 == 0 ? 70000 + rng() % 70000 : rng() % 3000;
      text += std::string(len, static_cast<char>('a' + i % 26));
      if (i + 1 < lines || rng() % 2) text += '\n';  // with or without a final newline
    }
    const std::string path = dir.write("log-" + std::to_string(trial), text);
    for (long n : {0L, 1L, 2L, 3L, 10L, 100L, 399L, 400L, 1000L})
      CHECK_MESSAGE(tail_offset(path, n) == tail_by_reading_it_all(text, n), "trial " << trial << ", --tail " << n);
  }
  CHECK(tail_offset(dir.path() + "/no-such-log", 5) == 0);
  CHECK(tail_offset(dir.write("empty", ""), 5) == 0);
  CHECK(tail_offset(dir.write("one", "only line\n"), 1) == 0);
  CHECK(tail_offset(dir.write("nl", "\n\n\n"), 1) == 2);
}

TEST_CASE("--tail 1 of a 3 GiB log takes milliseconds and no more memory than a block") {
  airhost_test::TempDir dir;
  const std::string path = dir.path() + "/big.log";
  {
    // Sparse: 3 GiB of file, nearly none of it on disk. Then its last lines.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{3} << 30) == 0);
    ::close(fd);
    std::ofstream(path, std::ios::app) << "\nsecond to last\nlast line\n";
  }
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  const auto t0 = std::chrono::steady_clock::now();
  const off_t at = tail_offset(path, 1);
  const auto took = std::chrono::steady_clock::now() - t0;
  ::getrusage(RUSAGE_SELF, &after);
  CHECK(at == (off_t{3} << 30) + 16);  // "\nsecond to last\n" is 16 bytes
  CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(took).count() < 1000);
  CHECK(after.ru_maxrss - before.ru_maxrss < 16 * 1024);  // KiB: far below the file's 3 GiB
}
