// The node link's wire: a buffered connection over a real socketpair with small kernel
// buffers. A peer that does not read never blocks the sender; frames arrive whole and in
// order when it reads again; the output cap refuses a frame whole; a gone peer is `closed`,
// never a SIGPIPE; bytes that are not link frames are an error, not an allocation.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "launch/link/link_wire.hpp"

using namespace airhost::detail;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Two connected stream sockets whose kernel buffers are as small as Linux allows, so that a
// few KiB fill them.
struct Pair {
  int a = -1, b = -1;
  Pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a = sv[0];
    b = sv[1];
    const int small = 4096;
    REQUIRE(::setsockopt(a, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    REQUIRE(::setsockopt(b, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
  }
};

// Frame `i`: its number, then a payload of `size` bytes that says which frame it belongs to,
// so a frame cut or spliced with another cannot pass for whole.
std::string numbered_frame(int i, std::size_t size) {
  std::string payload = std::to_string(i) + ":";
  payload.resize(size, static_cast<char>('a' + i % 26));
  return link_frame(LinkKind::down, {{"n", payload}});
}

bool is_numbered(const Frame& f, int i, std::size_t size) {
  auto fields = decode_fields(f.payload);
  const std::string& p = fields["n"];
  const std::string head = std::to_string(i) + ":";
  if (f.kind != static_cast<std::uint16_t>(LinkKind::down) || p.size() != size || p.rfind(head, 0) != 0) return false;
  return p.find_first_not_of(static_cast<char>('a' + i % 26), head.size()) == std::string::npos;
}

// Runs both ends until `reader` has `want` frames or `limit` passes: the writer flushes on
// POLLOUT, the reader reads on POLLIN.
std::vector<Frame> pump(LinkConnection& writer, LinkConnection& reader, std::size_t want, std::chrono::milliseconds limit) {
  std::vector<Frame> got;
  const auto until = Clock::now() + limit;
  while (got.size() < want && Clock::now() < until) {
    pollfd fds[2] = {{writer.fd(), writer.poll_events(), 0}, {reader.fd(), POLLIN, 0}};
    ::poll(fds, 2, 50);
    if (fds[0].revents & POLLOUT) REQUIRE(writer.flush() == LinkIo::ok);
    if (fds[1].revents) {
      reader.receive();
      while (auto f = reader.next_frame()) got.push_back(std::move(*f));
    }
  }
  return got;
}

}  // namespace

TEST_CASE("a peer that does not read never blocks the sender, and gets every frame whole and in order later") {
  Pair pair;
  LinkConnection sender(pair.a);
  LinkConnection receiver(pair.b);
  constexpr int kFrames = 200;
  constexpr std::size_t kSize = 1000;  // 200 KB in all: many times what the kernel holds here
  const auto t0 = Clock::now();
  for (int i = 0; i < kFrames; ++i) REQUIRE(sender.send(numbered_frame(i, kSize)) == LinkIo::ok);
  // The old send_all waited up to a second for room, frame after frame.
  CHECK(Clock::now() - t0 < 200ms);
  CHECK(sender.output_pending() > 100 * kSize);  // most of it waits in the buffer, not the kernel
  CHECK((sender.poll_events() & POLLOUT) != 0);

  const auto got = pump(sender, receiver, kFrames, 5s);
  REQUIRE(got.size() == kFrames);
  for (int i = 0; i < kFrames; ++i) CHECK_MESSAGE(is_numbered(got[static_cast<std::size_t>(i)], i, kSize), "frame " << i);
  CHECK(sender.output_pending() == 0);
  CHECK((sender.poll_events() & POLLOUT) == 0);
  CHECK(receiver.bytes_received() == kFrames * numbered_frame(0, kSize).size());
}

TEST_CASE("past the output cap a frame is refused whole, and what was queued before still arrives whole") {
  Pair pair;
  constexpr std::size_t kCap = 16 * 1024;
  LinkConnection sender(pair.a, kCap);
  LinkConnection receiver(pair.b);
  const std::size_t frame_size = numbered_frame(0, 3000).size();
  int accepted = 0;
  LinkIo last = LinkIo::ok;
  for (int i = 0; i < 1000 && last == LinkIo::ok; ++i) {
    const std::size_t before = sender.output_pending();
    last = sender.send(numbered_frame(i, 3000));
    if (last == LinkIo::ok) ++accepted;
    else CHECK(sender.output_pending() == before);  // nothing of the refused frame was queued
  }
  REQUIRE(last == LinkIo::full);
  CHECK(sender.output_pending() + frame_size > kCap);
  CHECK(sender.output_pending() <= kCap);
  // Refused again while nothing moves: the peer stays stuck, its caller declares it lost.
  CHECK(sender.send(numbered_frame(accepted, 3000)) == LinkIo::full);

  const auto got = pump(sender, receiver, static_cast<std::size_t>(accepted), 5s);
  REQUIRE(got.size() == static_cast<std::size_t>(accepted));
  for (int i = 0; i < accepted; ++i) CHECK(is_numbered(got[static_cast<std::size_t>(i)], i, 3000));
  // Nothing half-sent is left to be glued to the next frame: once read, the next one is whole.
  REQUIRE(sender.send(numbered_frame(accepted, 3000)) == LinkIo::ok);
  const auto next = pump(sender, receiver, 1, 5s);
  REQUIRE(next.size() == 1);
  CHECK(is_numbered(next[0], accepted, 3000));
}

TEST_CASE("a peer whose end is gone makes a send closed, not a SIGPIPE, and drops the output") {
  Pair pair;
  LinkConnection sender(pair.a);
  ::close(pair.b);
  CHECK(sender.send(numbered_frame(0, 100)) == LinkIo::closed);
  CHECK(sender.output_pending() == 0);
  CHECK(sender.receive() == LinkIo::closed);
}

TEST_CASE("the reader takes the frames sent before the close, then the close") {
  Pair pair;
  LinkConnection sender(pair.a);
  LinkConnection receiver(pair.b);
  REQUIRE(sender.send(numbered_frame(1, 10)) == LinkIo::ok);
  REQUIRE(sender.send(numbered_frame(2, 10)) == LinkIo::ok);
  sender.close_gently();
  CHECK_FALSE(sender.is_open());
  CHECK(receiver.receive() == LinkIo::closed);
  auto a = receiver.next_frame();
  auto b = receiver.next_frame();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(is_numbered(*a, 1, 10));
  CHECK(is_numbered(*b, 2, 10));
  CHECK_FALSE(receiver.next_frame());
}

TEST_CASE("bytes that are not link frames, or a frame longer than any link frame, are an error") {
  SUBCASE("bad magic") {
    Pair pair;
    LinkConnection receiver(pair.b);
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    REQUIRE(::write(pair.a, junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
    CHECK(receiver.receive() == LinkIo::ok);
    CHECK_THROWS_WITH_AS(receiver.next_frame(), "node link corrupted: bad frame magic", FrameError);
    ::close(pair.a);
  }
  SUBCASE("a length over the cap, refused from the header") {
    Pair pair;
    LinkConnection receiver(pair.b);
    const std::string header = encode_frame_header(static_cast<std::uint16_t>(LinkKind::down), kMaxLinkFrame + 1);
    REQUIRE(::write(pair.a, header.data(), header.size()) == static_cast<ssize_t>(header.size()));
    CHECK(receiver.receive() == LinkIo::ok);
    CHECK_THROWS_WITH_AS(receiver.next_frame(), doctest::Contains(("over the cap of " + std::to_string(kMaxLinkFrame)).c_str()), FrameError);
    ::close(pair.a);
  }
}

TEST_CASE("flush_all gives every connection one deadline in all, not a wait per connection") {
  Pair p1, p2;
  LinkConnection s1(p1.a), s2(p2.a);
  LinkConnection r1(p1.b), r2(p2.b);  // neither reads
  for (int i = 0; i < 50; ++i) {
    REQUIRE(s1.send(numbered_frame(i, 1000)) == LinkIo::ok);
    REQUIRE(s2.send(numbered_frame(i, 1000)) == LinkIo::ok);
  }
  const auto t0 = Clock::now();
  flush_all({&s1, &s2}, Clock::now() + 300ms);
  const auto took = Clock::now() - t0;
  CHECK(took >= 250ms);
  CHECK(took < 800ms);
  CHECK(s1.output_pending() > 0);
  CHECK(s2.output_pending() > 0);
}

TEST_CASE("a connection owns its descriptor: moved, it is closed once, by the last owner") {
  Pair pair;
  const int fd = pair.a;
  {
    LinkConnection first(fd);
    LinkConnection second(std::move(first));
    CHECK(first.fd() == -1);
    CHECK(second.fd() == fd);
    CHECK(::fcntl(fd, F_GETFD) >= 0);
  }
  CHECK(::fcntl(fd, F_GETFD) == -1);  // closed with `second`
  ::close(pair.b);
}
