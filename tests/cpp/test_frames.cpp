#include <doctest/doctest.h>

#include "launch/frames.hpp"

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
