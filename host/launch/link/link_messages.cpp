// link_messages.cpp — see link_messages.hpp.
#include "launch/link/link_messages.hpp"

#include <algorithm>

#include "launch/link/link_wire.hpp"
#include "launch/rank/frames.hpp"

namespace airhost::detail {
namespace {

const char* flag(bool b) { return b ? "1" : "0"; }

}  // namespace

std::string encode_down(int attempt, const NodeDown& d) {
  return encode_fields({{"node", std::to_string(d.node)},
                        {"message", d.message},
                        {"cascade", flag(d.cascade)},
                        {"timed_out", flag(d.timed_out)},
                        {"hung", flag(d.hung)},
                        {"lost", flag(d.lost)},
                        {"grow", flag(d.grow)},
                        {"attempt", std::to_string(attempt)}});
}

NodeDown decode_down(std::string_view payload) {
  auto f = decode_fields(payload);
  NodeDown d{field_int(f["node"], -1), f["message"], f["cascade"] == "1"};
  d.timed_out = f["timed_out"] == "1";
  d.hung = f["hung"] == "1";
  d.lost = f["lost"] == "1";
  d.grow = f["grow"] == "1";
  d.attempt = std::max(0, field_int(f["attempt"], 0));
  return d;
}

std::string encode_stopped(const Stopped& s) {
  return encode_fields({{"attempt", std::to_string(s.attempt)}, {"restart", flag(s.restart)}, {"leave", flag(s.leave)}});
}

Stopped decode_stopped(std::string_view payload) {
  auto f = decode_fields(payload);
  return Stopped{std::max(0, field_int(f["attempt"], 0)), f["restart"] == "1", f["leave"] == "1"};
}

std::string encode_restart(int attempt, int nodes, int node_rank) {
  if (nodes < 0) return encode_fields({{"attempt", std::to_string(attempt)}});
  return encode_fields(
      {{"attempt", std::to_string(attempt)}, {"nodes", std::to_string(nodes)}, {"node_rank", std::to_string(node_rank)}});
}

std::string encode_welcome(const Place& p) {
  return encode_fields({{"host", p.host},
                        {"nodes", std::to_string(p.nodes)},
                        {"node_rank", std::to_string(p.node_rank)},
                        {"attempt", std::to_string(p.attempt)},
                        {"store_port", std::to_string(p.store_port)}});
}

Place decode_place(std::string_view payload) {
  auto f = decode_fields(payload);
  Place p;
  p.attempt = std::max(0, field_int(f["attempt"], 0));
  p.nodes = f.count("nodes") ? field_int(f["nodes"], -1) : -1;
  p.node_rank = f.count("node_rank") ? field_int(f["node_rank"], -1) : -1;
  p.host = f["host"];
  const int port = field_int(f["store_port"], 0);
  p.store_port = port > 0 && port < 65536 ? port : 0;
  return p;
}

bool place_fits(const Place& p, int max_nodes) {
  return p.nodes >= 2 && p.nodes <= max_nodes && p.node_rank >= 1 && p.node_rank < p.nodes;
}

}  // namespace airhost::detail
