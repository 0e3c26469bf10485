// fuzz_link_messages.cpp — what the frames of a joined group say (launch/link/link_messages.hpp):
// a node down (lost, leaving, node 0 growing the group), a node's ranks stopped, node 0's
// restart and welcome with a node's place. The first byte picks the decoder and a MAX for
// place_fits; the rest is the payload. Malformed input may only raise FrameError; a decoded
// message must encode and decode to itself, and a place that fits must be one a node can take
// (2 to MAX nodes, a rank other than node 0's). Anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "launch/link/link_messages.hpp"
#include "launch/rank/frames.hpp"

using namespace airhost::detail;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int max_nodes = 1 + data[0] % 64;
  try {
    switch (data[0] % 3) {
      case 0: {
        const NodeDown d = decode_down(payload);
        check(d.attempt >= 0);
        const NodeDown again = decode_down(encode_down(d.attempt, d));
        check(again.node == d.node && again.message == d.message && again.cascade == d.cascade &&
              again.timed_out == d.timed_out && again.hung == d.hung && again.lost == d.lost && again.grow == d.grow &&
              again.attempt == d.attempt);
        break;
      }
      case 1: {
        const Stopped s = decode_stopped(payload);
        check(s.attempt >= 0);
        const Stopped again = decode_stopped(encode_stopped(s));
        check(again.attempt == s.attempt && again.restart == s.restart && again.leave == s.leave);
        break;
      }
      default: {
        const Place p = decode_place(payload);
        check(p.attempt >= 0 && p.store_port >= 0 && p.store_port < 65536);
        if (place_fits(p, max_nodes)) check(p.nodes >= 2 && p.nodes <= max_nodes && p.node_rank >= 1 && p.node_rank < p.nodes);
        const Place welcomed = decode_place(encode_welcome(p));
        check(welcomed.attempt == p.attempt && welcomed.nodes == p.nodes && welcomed.node_rank == p.node_rank &&
              welcomed.host == p.host && welcomed.store_port == p.store_port);
        const Place restarted = decode_place(encode_restart(p.attempt, p.nodes, p.node_rank));
        check(restarted.attempt == p.attempt && restarted.nodes == (p.nodes < 0 ? -1 : p.nodes));
        break;
      }
    }
  } catch (const FrameError&) {
  }
  return 0;
}
