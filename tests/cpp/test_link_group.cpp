// The group's agreement as one node knows it (GroupState): who is down, who is done, by
// attempt, and when nothing more can come. No sockets: reports are fed in by hand.
#include <doctest/doctest.h>

#include <algorithm>

#include "launch/link/link_group.hpp"

using namespace airhost::detail;

namespace {

NodeDown down(int node, const std::string& why, bool cascade = false) {
  return NodeDown{node, "node " + std::to_string(node) + " " + why, cascade};
}

}  // namespace

TEST_CASE("node 0 hears each node on its own connection, another node hears all through node 0") {
  CHECK(GroupState(4, 0).peers() == std::vector<int>{1, 2, 3});
  CHECK(GroupState(4, 2).peers() == std::vector<int>{0});
  CHECK(GroupState(4, 0).hub());
  CHECK_FALSE(GroupState(4, 2).hub());
}

TEST_CASE("the first report of a node is news; the verdict is the first that is not a cascade") {
  GroupState g(3, 0);
  CHECK_FALSE(g.verdict(0));
  CHECK_FALSE(g.any_down(0));
  CHECK(g.report_down(0, down(2, "failed: rank 5 lost a peer", true), 2));
  CHECK(g.any_down(0));
  CHECK_FALSE(g.real_down(0));
  CHECK(g.verdict(0)->node == 2);  // a cascade is better than nothing
  CHECK(g.report_down(0, down(1, "failed: rank 3 exited with code 1"), 1));
  CHECK(g.real_down(0));
  CHECK(g.verdict(0)->message == "node 1 failed: rank 3 exited with code 1");
  // A node heard of once is not news again, whatever the second report says.
  CHECK_FALSE(g.report_down(0, down(1, "was lost: its connection closed"), 0));
  CHECK(g.verdict(0)->message == "node 1 failed: rank 3 exited with code 1");
}

TEST_CASE("node 0 is quiet once every other node is gone or said it stops") {
  GroupState g(3, 0);
  CHECK_FALSE(g.quiet(0));
  g.report_down(0, down(1, "stopped its ranks"), 1);
  CHECK_FALSE(g.quiet(0));  // node 2 may still report
  g.connection_gone(2);
  CHECK(g.quiet(0));
}

TEST_CASE("another node is quiet once node 0 is gone or said it stops, whatever it relayed") {
  GroupState g(3, 2);
  g.report_down(0, down(1, "failed"), 0);  // node 1's report, relayed by node 0: node 0 can still speak
  CHECK_FALSE(g.quiet(0));
  g.report_down(0, down(0, "stopped its ranks (node 1 failed)", true), 0);
  CHECK(g.quiet(0));
  GroupState h(3, 2);
  h.connection_gone(0);
  CHECK(h.quiet(0));
}

TEST_CASE("the exit barrier ends only when every node is done, node 0 too, and node 0 says it once") {
  GroupState hub(3, 0);
  hub.report_done(0, 1);
  CHECK_FALSE(hub.should_end(0));
  hub.report_done(0, 0);  // node 0's own ranks succeeded
  CHECK_FALSE(hub.should_end(0));
  hub.report_done(0, 2);
  CHECK(hub.all_done(0));
  CHECK(hub.should_end(0));
  hub.end(0);
  CHECK(hub.ended(0));
  CHECK_FALSE(hub.should_end(0));

  GroupState spoke(3, 1);
  for (int n = 0; n < 3; ++n) spoke.report_done(0, n);
  CHECK_FALSE(spoke.should_end(0));  // only node 0 decides
  CHECK_FALSE(spoke.ended(0));
  spoke.end(0);
  CHECK(spoke.ended(0));
}

TEST_CASE("a close is expected after the node said it stops, said it is done, or the group ended") {
  GroupState g(4, 0);
  CHECK_FALSE(g.close_expected(0, 1));
  g.report_down(0, down(1, "failed"), 1);
  CHECK(g.close_expected(0, 1));
  g.report_down(0, down(2, "was lost: nothing heard"), 0);  // this node's finding, not node 2's word
  CHECK_FALSE(g.close_expected(0, 2));
  g.report_done(0, 3);
  CHECK(g.close_expected(0, 3));
  GroupState ended(2, 1);
  ended.end(0);
  CHECK(ended.close_expected(0, 0));
}

TEST_CASE("reports are kept by attempt; a gone connection stays gone in every attempt") {
  GroupState g(3, 0);
  g.report_down(0, down(1, "failed"), 1);
  g.report_done(0, 2);
  CHECK_FALSE(g.verdict(1));  // attempt 1 starts clean
  CHECK_FALSE(g.any_down(1));
  CHECK_FALSE(g.close_expected(1, 1));
  CHECK_FALSE(g.close_expected(1, 2));
  CHECK(g.report_down(1, down(1, "failed again"), 1));  // news in attempt 1
  CHECK(g.verdict(1)->message == "node 1 failed again");
  CHECK(g.verdict(0)->message == "node 1 failed");
  g.connection_gone(2);
  CHECK(g.gone(2));
  CHECK(g.quiet(1));  // node 1 said it stops in attempt 1, node 2 is gone for good
  CHECK_FALSE(g.quiet(2));
}

TEST_CASE("after a failed attempt node 0 decides once every node stopped: a restart only when all want one") {
  GroupState g(3, 0);
  g.report_stopped(0, 1, true);
  g.report_stopped(0, 2, true);
  CHECK_FALSE(g.should_decide(0));  // node 0 itself has not stopped yet
  g.report_stopped(0, 0, true);
  REQUIRE(g.should_decide(0));
  CHECK(g.restart_agreed(0));
  g.decide(0, true);
  CHECK_FALSE(g.should_decide(0));
  CHECK(g.decision(0) == std::optional<bool>(true));
  CHECK_FALSE(g.decision(1).has_value());  // the next attempt starts clean

  // One node interrupted (it does not want a restart): the job ends.
  g.report_stopped(1, 0, true);
  g.report_stopped(1, 1, false);
  g.report_stopped(1, 2, true);
  REQUIRE(g.should_decide(1));
  CHECK_FALSE(g.restart_agreed(1));
}

TEST_CASE("a node that is lost is waited for when every other node wants a restart; another node never decides") {
  GroupState g(3, 0);
  g.report_stopped(0, 0, true);
  g.connection_gone(2);
  CHECK_FALSE(g.should_decide(0));  // node 1 has not said yet whether it wants a restart
  g.report_stopped(0, 1, true);
  REQUIRE(g.should_decide(0));
  CHECK_FALSE(g.restart_agreed(0));
  CHECK(g.rejoin_wanted(0) == std::vector<int>{2});
  g.came_back(0, 2);  // its new airhost joined again
  CHECK_FALSE(g.gone(2));
  CHECK(g.rejoin_wanted(0).empty());
  CHECK(g.restart_agreed(0));

  // A node interrupted while the group waits (it withdraws): no waiting, the job ends.
  GroupState w(3, 0);
  w.report_stopped(0, 0, true);
  w.report_stopped(0, 1, true);
  w.connection_gone(2);
  CHECK(w.rejoin_wanted(0) == std::vector<int>{2});
  w.report_stopped(0, 1, false);
  CHECK(w.rejoin_wanted(0).empty());
  CHECK_FALSE(w.restart_agreed(0));

  // A node that stopped for good and then left is not waited for; nor is anyone once node 0
  // itself wants no restart (restarts used up).
  GroupState left(2, 0);
  left.report_stopped(0, 0, true);
  left.report_stopped(0, 1, false);
  left.connection_gone(1);
  REQUIRE(left.should_decide(0));
  CHECK(left.rejoin_wanted(0).empty());
  GroupState used_up(2, 0);
  used_up.report_stopped(0, 0, false);
  used_up.connection_gone(1);
  REQUIRE(used_up.should_decide(0));
  CHECK(used_up.rejoin_wanted(0).empty());

  GroupState spoke(3, 1);
  CHECK(spoke.rejoin_wanted(0).empty());
  for (int n = 0; n < 3; ++n) spoke.report_stopped(0, n, true);
  CHECK_FALSE(spoke.should_decide(0));
  spoke.decide(0, false);  // what node 0's "final" says
  spoke.decide(0, true);   // the first decision stands
  CHECK(spoke.decision(0) == std::optional<bool>(false));
}

TEST_CASE("an elastic group goes on without its lost and leaving nodes only when every other node wants to") {
  GroupState g(4, 0);
  g.report_stopped(0, 0, true);
  g.report_stopped(0, 1, true);
  g.report_stopped(0, 2, false, true);  // its ranks failed past max_restarts: it leaves
  CHECK_FALSE(g.should_decide(0));      // a leaving node does not end the job: node 3 is awaited
  CHECK(g.go_on_without(0).empty());
  g.connection_gone(3);                 // node 3 is lost meanwhile
  CHECK(g.should_decide(0));
  CHECK(g.go_on_without(0) == std::vector<int>{2, 3});
  CHECK_FALSE(g.restart_agreed(0));

  GroupState h(3, 0);
  h.report_stopped(0, 0, true);
  h.report_stopped(0, 1, false);        // stopped for good (interrupted): the job ends
  h.report_stopped(0, 2, false, true);
  CHECK(h.should_decide(0));
  CHECK(h.go_on_without(0).empty());

  GroupState r(3, 0);                   // regrouped: two nodes, none gone, as numbered anew
  r.connection_gone(2);
  r.regroup(2, 0);
  CHECK_FALSE(r.gone(2));
  CHECK(r.nnodes() == 2);
}

namespace {

// Every node of a star of `n` nodes hears the reports as the wire carries them (each node its
// own, node 0 relaying to the others); then nodes end, each once the nodes it follows have
// (an ended node's connection closes: node 0 sees each close, another node only node 0's).
// The order in which they could end; shorter than `n` when some wait for each other.
std::vector<int> end_order(int n, const std::vector<NodeDown>& reports) {
  std::vector<GroupState> g;
  for (int self = 0; self < n; ++self) g.emplace_back(n, self);
  for (const auto& d : reports) {
    g[0].report_down(0, d, d.node);
    for (int k = 1; k < n; ++k) g[k].report_down(0, d, d.node == k ? k : 0);
  }
  std::vector<int> order;
  std::vector<bool> ended(n, false);
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 0; k < n; ++k) {
      if (ended[k] || !g[k].followed_nodes_gone(0)) continue;
      ended[k] = moved = true;
      order.push_back(k);
      if (k == 0)
        for (int j = 1; j < n; ++j) g[j].connection_gone(0);
      else
        g[0].connection_gone(k);
    }
  }
  return order;
}

}  // namespace

TEST_CASE("after a failure no node waits for one that waits for it: the failing node ends first, node 0 next, then the rest") {
  // Node 2's rank failed; every other node stops as a cascade (each says so for itself).
  auto cascade = [](int k) { return down(k, "stopped its ranks (node 2 failed)", true); };
  const auto order = end_order(5, {down(2, "failed: rank 2 exited with code 1"), cascade(0), cascade(1), cascade(3), cascade(4)});
  REQUIRE(order.size() == 5);
  CHECK(order[0] == 2);
  CHECK(order[1] == 0);
  // Node 0's own failure: it follows nobody, and the others follow it.
  const auto hub_failed = end_order(4, {down(0, "failed: rank 0 exited with code 1"), down(1, "stopped", true),
                                        down(2, "stopped", true), down(3, "stopped", true)});
  REQUIRE(hub_failed.size() == 4);
  CHECK(hub_failed[0] == 0);
  // Two nodes failing on their own: both end first, node 0 after both.
  const auto two = end_order(4, {down(1, "failed"), down(3, "failed"), down(0, "stopped", true), down(2, "stopped", true)});
  REQUIRE(two.size() == 4);
  CHECK(std::find(two.begin(), two.end(), 0) - two.begin() == 2);
  // A lost node (its airhost killed) leaves nothing to wait for: every node ends at once.
  NodeDown lost = down(3, "was lost: its connection closed");
  lost.lost = true;
  GroupState hub(4, 0), spoke(4, 1);
  hub.connection_gone(3);
  hub.report_down(0, lost, 0);
  spoke.report_down(0, lost, 0);
  CHECK(hub.followed_nodes_gone(0));
  CHECK(spoke.followed_nodes_gone(0));
}
