// fuzz_frames.cpp — the control channel's and the node link's bytes (launch/rank/frames.hpp,
// launch/link/link_wire.hpp): a stream cut in two at a point the input chooses, framed by
// FrameDecoder, each payload decoded as fields and as a node's hello. Malformed input may only
// raise FrameError; anything else (a crash, another exception, a sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "launch/rank/frames.hpp"
#include "launch/link/link_wire.hpp"

using namespace airhost::detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::size_t cut = all.empty() ? 0 : data[0] % (all.size() + 1);
  FrameDecoder decoder("fuzz", 1 << 20);
  try {
    decoder.feed(all.substr(0, cut));
    while (auto f = decoder.next()) {
      try { decode_fields(f->payload); } catch (const FrameError&) {}
      try { decode_hello(f->payload); } catch (const FrameError&) {}
    }
    decoder.feed(all.substr(cut));
    while (auto f = decoder.next()) {
      try { decode_fields(f->payload); } catch (const FrameError&) {}
      try { decode_hello(f->payload); } catch (const FrameError&) {}
    }
  } catch (const FrameError&) {
  }
  // The same bytes as one payload, unframed.
  try { decode_fields(all); } catch (const FrameError&) {}
  try { decode_hello(all); } catch (const FrameError&) {}
  return 0;
}
