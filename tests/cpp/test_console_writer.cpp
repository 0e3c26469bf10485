// The host's console output (host/launch/output/console_writer.hpp) over real pipes: a reader that
// stops reading never blocks the writer, the cap bounds what waits, and what was skipped is
// said once the reader is back.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "launch/output/console_writer.hpp"

using airhost::detail::ConsoleWriter;
using namespace std::chrono_literals;

namespace {

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  std::string read_available() const {
    std::string out;
    char buf[65536];
    ::fcntl(r, F_SETFL, O_NONBLOCK);
    for (ssize_t n; (n = ::read(r, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }
};

}  // namespace

TEST_CASE("bytes queued for a reader that reads arrive whole and in order") {
  Pipe p;
  ConsoleWriter w(p.w, 1 << 20, "the logs");
  std::string all;
  for (int i = 0; i < 1000; ++i) {
    std::string line = "line " + std::to_string(i) + "\n";
    all += line;
    w.write(line);
  }
  std::string got;
  std::thread reader([&] {
    char buf[4096];
    while (got.size() < all.size()) {
      ssize_t n = ::read(p.r, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
  });
  CHECK(w.drain(5s));
  reader.join();
  CHECK(got == all);
  CHECK(w.skipped_bytes() == 0);
}

TEST_CASE("a reader that stops reading never blocks write(), the cap bounds the queue, and the skip is said") {
  Pipe p;
  ConsoleWriter w(p.w, 256 * 1024, "the logs in /runs/x/logs");
  const std::string line(1023, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4096; ++i) w.write(line + "\n");  // 4 MiB into a 64 KiB pipe nobody reads
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  // The pipe (64 KiB) and the queue hold the rest: up to 4 times the cap while the reader is
  // only behind, the cap itself once it has taken nothing for kStalledAfter.
  CHECK(w.skipped_bytes() > 2900u * 1024);
  std::this_thread::sleep_for(ConsoleWriter::kStalledAfter + 100ms);
  const auto before = w.skipped_bytes();
  w.write(std::string(1023, 'z') + "\n");
  CHECK(w.skipped_bytes() == before + 1024);  // stalled: skipped at once
  CHECK_FALSE(w.drain(300ms));                  // nobody reads: it gives up instead of waiting
  // The reader comes back: what was queued arrives, and a line of its own says what was missed.
  // How many notes there are depends on the scheduler: a writer thread that moved a line into
  // the pipe while the loop above ran made room, so the loop's next line went in after a note
  // for what was skipped until then. Every note is whole and on its own line.
  std::string got;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(p.r, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  });
  w.write("after\n");  // shown, or skipped if the reader has not taken anything yet: said either way
  CHECK(w.drain(5s));
  w.close();
  ::close(p.w);  // the reader sees the end once everything was written
  p.w = -1;
  reader.join();
  const std::string tail = " of output skipped here: the reader did not keep up (every byte is in the logs in /runs/x/logs)\n";
  std::size_t notes = 0, mib_notes = 0;
  for (std::size_t at = got.find("airhost: "); at != std::string::npos; at = got.find("airhost: ", at + 1)) {
    ++notes;
    CHECK(got[at - 1] == '\n');  // on a line of its own
    const auto end = got.find('\n', at);
    REQUIRE(end != std::string::npos);
    const std::string note = got.substr(at, end + 1 - at);
    CHECK(note.size() > tail.size());
    CHECK(note.compare(note.size() - tail.size(), tail.size(), tail) == 0);
    if (note.find(" MiB" + tail) != std::string::npos) ++mib_notes;
  }
  CHECK(notes >= 1);
  CHECK(mib_notes >= 1);  // the bulk (about 3 MiB) is said in one note, whatever came before it
}

TEST_CASE("a reader gone for good (EPIPE) neither kills the host nor blocks it") {
  Pipe p;
  ::close(p.r);
  p.r = -1;
  ConsoleWriter w(p.w, 1 << 20, "the logs");
  w.write("nobody will read this\n");
  CHECK(w.drain(2s));  // dropped, not waited for; SIGPIPE did not kill this process
  w.write("nor this\n");
  CHECK(w.drain(2s));
}

TEST_CASE("destroying a writer whose reader is stalled returns at once") {
  Pipe p;
  const auto t0 = std::chrono::steady_clock::now();
  {
    ConsoleWriter w(p.w, 4 << 20, "the logs");
    for (int i = 0; i < 1024; ++i) w.write(std::string(1023, 'y') + "\n");
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}
