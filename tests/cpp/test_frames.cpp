#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <system_error>
#include <thread>

#include "launch/rank/frames.hpp"

using namespace airhost::detail;

TEST_CASE("a frame survives encoding and decoding whatever the chunking") {
  std::string stream = encode_frame(FrameKind::result, "first") + encode_frame(FrameKind::error, "") +
                       encode_frame(static_cast<std::uint16_t>(999), std::string(100000, 'x'));
  for (std::size_t chunk : {1u, 7u, 16u, 4096u, 1000000u}) {
    FrameDecoder d;
    std::vector<Frame> got;
    for (std::size_t at = 0; at < stream.size(); at += chunk) {
      d.feed(std::string_view(stream).substr(at, chunk));
      while (auto f = d.next()) got.push_back(std::move(*f));
    }
    REQUIRE(got.size() == 3);
    CHECK(got[0].kind == static_cast<std::uint16_t>(FrameKind::result));
    CHECK(got[0].payload == "first");
    CHECK(got[1].payload.empty());
    CHECK(got[2].kind == 999);  // unknown kinds are delivered, for the reader to skip
    CHECK(got[2].payload.size() == 100000);
    CHECK(d.pending() == 0);
  }
}

TEST_CASE("a truncated frame stays pending instead of being delivered") {
  std::string f = encode_frame(FrameKind::result, "payload");
  FrameDecoder d;
  d.feed(std::string_view(f).substr(0, f.size() - 1));
  CHECK_FALSE(d.next().has_value());
  CHECK(d.pending() == f.size() - 1);
}

TEST_CASE("a stream that is not airhost frames is reported as corrupted") {
  FrameDecoder d;
  d.feed("this is not a frame header at all");
  CHECK_THROWS_AS(d.next(), FrameError);
}

TEST_CASE("a frame announcing more than the cap is refused from its header, before any allocation") {
  FrameDecoder d;
  d.feed(encode_frame_header(2, 1ull << 62));  // what a stray write could announce
  try {
    (void)d.next();
    FAIL("a 2^62-byte frame was accepted");
  } catch (const FrameError& e) {
    CHECK(std::string(e.what()).find("over the cap of 67108864") != std::string::npos);
  }
  FrameDecoder small("control channel", 10);
  small.feed(encode_frame(FrameKind::result, "0123456789"));  // exactly the cap: fine
  CHECK(small.next().has_value());
  small.feed(encode_frame(FrameKind::result, "0123456789A"));
  CHECK_THROWS_AS(small.next(), FrameError);
}

TEST_CASE("a decoder with a cap refuses a longer frame from its header alone, naming its channel") {
  FrameDecoder d("node link", 1024);
  d.feed(encode_frame(FrameKind::result, std::string(1024, 'x')));
  REQUIRE(d.next().has_value());  // at the cap: fine
  d.feed(encode_frame_header(2, 1ull << 62));  // no payload sent: nothing may be reserved for it
  CHECK_THROWS_WITH_AS(d.next(), "node link corrupted: a frame announces 4611686018427387904 bytes, over the cap of 1024 (a stray write into its descriptor?)",
                       FrameError);
  FrameDecoder plain;
  plain.feed("not a frame header at all");
  CHECK_THROWS_WITH_AS(plain.next(), "control channel corrupted: bad frame magic", FrameError);
}

TEST_CASE("the header says little-endian magic, kind, flags and length") {
  std::string h = encode_frame_header(3, 0x0102030405ull);
  REQUIRE(h.size() == kFrameHeaderSize);
  CHECK(h.substr(0, 4) == "AHF1");
  CHECK(static_cast<unsigned char>(h[4]) == 3);
  CHECK(static_cast<unsigned char>(h[8]) == 0x05);
  CHECK(static_cast<unsigned char>(h[12]) == 0x01);
}

TEST_CASE("error fields round-trip, binary values included, and malformed lists throw") {
  Fields f{{"type", "ValueError"}, {"pickled", std::string("\0\xff\x01", 3)}, {"traceback", "line1\nline2"}};
  CHECK(decode_fields(encode_fields(f)) == f);
  std::string bad = encode_fields(f);
  bad.pop_back();
  CHECK_THROWS_AS(decode_fields(bad), FrameError);
}

TEST_CASE("send_with_fds delivers every byte and the descriptors with the first read") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int p1[2], p2[2];
  REQUIRE(::pipe(p1) == 0);
  REQUIRE(::pipe(p2) == 0);
  // Larger than the socket buffer, so the sender needs several sendmsg calls.
  const std::string frame = encode_frame(FrameKind::result_fd, std::string(4 << 20, 'r'));
  const int fds[2] = {p1[1], p2[1]};
  std::thread sender([&] { send_with_fds(sv[0], frame, fds, 2, "test socket"); });

  std::string got(frame.size(), '\0');
  std::size_t have = 0;
  std::vector<int> passed;
  while (have < got.size()) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{got.data() + have, got.size() - have};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sv[1], &msg, MSG_CMSG_CLOEXEC);
    REQUIRE(n > 0);
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        passed.push_back(fd);
      }
      CHECK(have == 0);  // only the read that brings the first byte carries them
    }
    have += static_cast<std::size_t>(n);
  }
  sender.join();
  CHECK(got == frame);
  REQUIRE(passed.size() == 2);
  // The passed descriptors are the pipes' write ends: what goes in comes out of p1/p2.
  CHECK(::write(passed[0], "a", 1) == 1);
  CHECK(::write(passed[1], "b", 1) == 1);
  char c = 0;
  CHECK(::read(p1[0], &c, 1) == 1);
  CHECK(c == 'a');
  CHECK(::read(p2[0], &c, 1) == 1);
  CHECK(c == 'b');
  for (int fd : {sv[0], sv[1], p1[0], p1[1], p2[0], p2[1], passed[0], passed[1]}) ::close(fd);

  CHECK_THROWS_AS(send_with_fds(-1, "x", nullptr, 0, "closed socket"), std::system_error);
}
