// node_link_hub.cpp — node 0's decisions about the group, on the link's thread: once every node
// has stopped after a failure, restart the group or end it; an elastic job's shrink (go on
// without lost nodes while MIN are left) and growth (the nodes held at the door, taken in at a
// restart); the wait for lost nodes to come back (node_link_state.hpp has the state).
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "launch/link/node_link_state.hpp"

namespace airhost::detail {

void NodeLink::Impl::decide_if_all_stopped() {
  int of;
  bool restart;
  std::vector<int> lost_nodes, without;
  {
    std::lock_guard lock(m);
    of = attempt;
    if (!group.should_decide(of)) return;
    restart = group.restart_agreed(of);
    if (!restart) lost_nodes = group.rejoin_wanted(of);
    if (!restart && cfg.nnodes_min > 0) without = group.go_on_without(of);
  }
  // An elastic job with enough nodes left goes on at once without the lost ones, and without
  // those whose own ranks failed past max_restarts (they leave). The nodes held for the next
  // scale-up count: they are taken in with that restart (go_on_without numbers them).
  if (!without.empty()) {
    const int kept = group_size - static_cast<int>(without.size());
    if (kept + std::min(held_newcomers(), cfg.nnodes - kept) >= cfg.nnodes_min) return go_on_without(of, without);
  }
  if (!lost_nodes.empty() && rejoin_wait(of, lost_nodes)) return;
  {
    std::lock_guard lock(m);
    if (group.decision(of)) return;
    restart = group.restart_agreed(of);  // the lost nodes may have come back meanwhile
  }
  // The nodes that came are numbered before the decision is published: the launcher reads the
  // group's size and its rank as soon as it hears "restart".
  std::vector<NodeHello> grown = nodes;
  const int k = restart ? number_newcomers(group_size, grown) : group_size;
  {
    std::lock_guard lock(m);
    if (group.decision(of)) return;
    if (restart && k != group_size) {
      group_size = k;
      group.regroup(k, 0);
      nodes = std::move(grown);
    }
    group.decide(of, restart);
    if (restart) attempt = of + 1;
  }
  rejoin_deadline = {};
  if (cfg.nnodes_min == 0) desk.reset();  // the port is rank 0's store's again (an elastic job's store has its own)
  cv.notify_all();
  if (restart) welcome_newcomers(of);
  // An elastic job's restart says the group's size and each node's rank (nodes came or went).
  auto restart_frame = [&](int node) {
    if (cfg.nnodes_min == 0) return message_frame(LinkKind::restart, encode_restart(of + 1));
    return message_frame(LinkKind::restart, encode_restart(of + 1, group_size, node));
  };
  const std::string final_frame = link_frame(LinkKind::final, {{"attempt", std::to_string(of)}});
  for (auto& p : peers) {
    if (is_gone(p)) continue;
    send_to(p, !restart ? final_frame
                        : came_back.count(p.node.node_rank) ? welcome(p.node.node_rank, of + 1)
                                                            : restart_frame(p.node.node_rank));
  }
  came_back.clear();
  if (restart) send_shared_file();
}

std::string NodeLink::Impl::welcome(int node, int of_attempt) const {
  return message_frame(LinkKind::welcome, encode_welcome({of_attempt, group_size, node, nodes[0].host, store_port}));
}

int NodeLink::Impl::held_newcomers() {
  if (newcomers.empty()) return 0;
  std::vector<pollfd> fds;
  for (auto& n : newcomers) fds.push_back(pollfd{n.conn.fd(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), 0) > 0) {
    for (std::size_t i = 0; i < newcomers.size(); ++i) {
      if (!fds[i].revents) continue;
      LinkPeer& n = newcomers[i];
      bool gone = n.conn.receive() == LinkIo::closed;
      try {
        while (n.conn.next_frame()) {}  // it says nothing the group needs before its welcome
      } catch (const FrameError&) {
        gone = true;
      }
      if (!gone) continue;
      say(describe_node(n.node) + " went away before it was taken in; the group goes on as it is");
      n.conn.close();
    }
    std::erase_if(newcomers, [](const LinkPeer& n) { return !n.conn.is_open(); });
  }
  return static_cast<int>(newcomers.size());
}

int NodeLink::Impl::number_newcomers(int base, std::vector<NodeHello>& into) {
  int k = base;
  for (auto& n : newcomers) {
    n.node.node_rank = -1;
    if (!n.conn.is_open() || k >= cfg.nnodes) continue;
    n.node.node_rank = k++;
    into.push_back(n.node);
  }
  return k;
}

void NodeLink::Impl::welcome_newcomers(int of) {
  std::string listed;
  for (auto& n : newcomers) {
    if (!n.conn.is_open() || n.node.node_rank < 0) continue;
    listed += (listed.empty() ? "" : ", ") + describe_node(n.node);
    (void)n.conn.send(welcome(n.node.node_rank, of + 1));
    joining.push_back(Peer{n.node, std::move(n.conn), 0, Clock::now()});
  }
  newcomers.clear();
  last_group_start = Clock::now();
  grow_asked = false;
  if (!listed.empty())
    say(listed + " joined the group: restart " + std::to_string(of + 1) + " with " + std::to_string(group_size) +
        " nodes");
}

void NodeLink::Impl::grow_check() {
  if (!desk || cfg.nnodes_min == 0 || rejoin_deadline != Clock::time_point{}) return;
  std::vector<int> slots;  // the places left, once the held nodes that went are let go
  for (int r = group_size + held_newcomers(); r < cfg.nnodes; ++r) slots.push_back(r);
  for (auto& n : desk->take(slots)) {
    say(describe_node(n.node) + " came; it joins the group at its next restart");
    n.node.node_rank = -1;  // numbered when it is taken in
    newcomers.push_back(std::move(n));
  }
  if (held_newcomers() == 0 || grow_asked || Clock::now() - last_group_start < cfg.scale_up_interval) return;
  {
    std::lock_guard lock(m);
    if (group.any_down(attempt) || group.decision(attempt)) return;
  }
  grow_asked = true;
  std::vector<std::string> names;
  for (const auto& n : newcomers) names.push_back(describe_node(n.node));
  NodeDown d{0, join_list(names) + " came to the job: every node restarts its ranks to "
                "take " + (newcomers.size() > 1 ? "them" : "it") + " in (--nnodes " + std::to_string(cfg.nnodes_min) +
                ":" + std::to_string(cfg.nnodes) + ")", false};
  d.grow = true;
  report(attempt, d, me, nullptr);
}

void NodeLink::Impl::go_on_without(int of, const std::vector<int>& lost_nodes) {
  const std::set<int> lost(lost_nodes.begin(), lost_nodes.end());
  // A node that leaves (its ranks failed past max_restarts) is still here: it hears that the
  // job ends for it, and ends by its ranks' outcome. A lost one is gone.
  std::vector<std::string> names;
  const std::string final_frame = link_frame(LinkKind::final, {{"attempt", std::to_string(of)}});
  for (auto& p : peers) {
    if (p.dropped || !lost.count(p.node.node_rank)) continue;
    if (is_gone(p)) {
      names.push_back(describe_node(p.node) + " was lost");
    } else {
      names.push_back(describe_node(p.node) + " left the job (its ranks failed past --max-restarts " +
                      std::to_string(cfg.max_restarts) + ")");
      send_to(p, final_frame);
    }
  }
  std::vector<NodeHello> now{nodes[0]};
  int next = 1;
  for (auto& p : peers) {
    if (p.dropped || lost.count(p.node.node_rank)) {
      p.dropped = true;
      continue;
    }
    p.node.node_rank = next++;
    now.push_back(p.node);
  }
  next = number_newcomers(next, now);  // before the decision is published (decide_if_all_stopped)
  {
    std::lock_guard lock(m);
    if (group.decision(of)) return;
    group.decide(of, true);
    attempt = of + 1;
    group_size = next;
    group.regroup(next, 0);
    nodes = std::move(now);
  }
  rejoin_deadline = {};
  cv.notify_all();
  std::string listed;
  for (std::size_t i = 0; i < names.size(); ++i) listed += (i ? "; " : "") + names[i];
  welcome_newcomers(of);
  say(listed + "; the job goes on with " +
      std::to_string(group_size) + " nodes (--nnodes " + std::to_string(cfg.nnodes_min) + ":" + std::to_string(cfg.nnodes) +
      "): restart " + std::to_string(of + 1) + ", not counted against --max-restarts");
  for (auto& p : peers)
    if (!p.dropped)
      send_to(p, message_frame(LinkKind::restart, encode_restart(of + 1, group_size, p.node.node_rank)));
  send_shared_file();
}

bool NodeLink::Impl::rejoin_wait(int of, const std::vector<int>& lost_nodes) {
  const auto now = Clock::now();
  if (rejoin_deadline == Clock::time_point{}) {
    if (!desk) {
      try {
        desk = std::make_unique<RejoinDesk>(cfg);
      } catch (const std::exception& e) {
        say(std::string(e.what()) + "; the job cannot wait for the lost node(s) to come back");
        return false;
      }
    }
    rejoin_deadline = now + cfg.join_timeout;
    std::string names;
    for (int n : lost_nodes)
      names += (names.empty() ? "" : ", ") + describe_node(nodes[static_cast<std::size_t>(n)]);
    say("the other nodes want a restart; waiting up to " + duration_text(cfg.join_timeout) +
              " (join_timeout) for " + names + " to come back: start its airhost again with the same arguments");
  }
  std::vector<int> still_lost;
  for (int n : lost_nodes)
    if (!came_back.count(n)) still_lost.push_back(n);
  for (auto& back : desk->take(still_lost)) {
    const int n = back.node.node_rank;
    for (auto& p : peers) {
      if (p.node.node_rank != n) continue;
      p.conn = std::move(back.conn);
      p.node = back.node;
      p.heard = 0;
      p.last_rx = Clock::now();
      p.got_file = false;
    }
    nodes[static_cast<std::size_t>(n)] = back.node;
    came_back.insert(n);
    {
      std::lock_guard lock(m);
      group.came_back(of, n);
    }
    say(describe_node(back.node) + " came back" + (cfg.join_token.empty() ? "" : " (its join token checked)"));
  }
  bool all_back, still_wanted;
  {
    std::lock_guard lock(m);
    all_back = group.restart_agreed(of);
    still_wanted = all_back || !group.rejoin_wanted(of).empty();
  }
  if (all_back) return false;
  if (!still_wanted) return false;  // a node withdrew meanwhile (stopped, or lost for good)
  if (now < rejoin_deadline) return true;
  std::string names;
  for (int n : lost_nodes) names += (names.empty() ? "" : ", ") + std::to_string(n);
  say("node" + std::string(lost_nodes.size() > 1 ? "s " : " ") + names + " did not come back within " +
      duration_text(cfg.join_timeout) + " (join_timeout); the job ends");
  return false;
}

}  // namespace airhost::detail
