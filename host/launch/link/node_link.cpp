// node_link.cpp — the link's thread: its poll loop, heartbeats, what every node does with the
// frames it hears, and the public calls (node_link.hpp has the protocol, node_link_state.hpp the
// state, node_link_hub.cpp node 0's decisions about the group; the wire, the door, the join and
// the agreement have files of their own).
#include "launch/link/node_link.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "base/unique_fd.hpp"
#include "base/util.hpp"
#include "launch/link/node_link_state.hpp"
#include "launch/run/run_dir.hpp"

namespace airhost::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Every signal but the faults: those stay deliverable, since a fault raised on this thread
// while blocked ends the process without the host's crash handling.
sigset_t signals_blocked_in_link_thread() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) sigdelset(&set, sig);
  return set;
}

}  // namespace

void NodeLink::Impl::send_shared_file() {
  if (me != 0 || cfg.shared_file.empty()) return;
  if (std::all_of(peers.begin(), peers.end(), [this](const Peer& p) { return p.got_file || is_gone(p); })) return;
  UniqueFd fd(::open(cfg.shared_file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return;  // not yet
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0 && text.size() <= kMaxSharedFile)
    text.append(buf, static_cast<std::size_t>(n));
  const std::string f = text.size() > kMaxSharedFile ? std::string() : link_frame(LinkKind::file, {{"text", text}});
  for (auto& p : peers)
    if (!p.got_file && !is_gone(p)) {
      p.got_file = true;
      if (!f.empty()) send_to(p, f);
    }
}

void NodeLink::Impl::take_shared_file(const std::string& text) {
  if (me == 0 || cfg.shared_file.empty()) return;
  try {
    write_file_atomic(cfg.shared_file, text);
  } catch (const std::exception& e) {
    say("cannot write " + cfg.shared_file + " as node 0 sent it: " + e.what());
  }
}

void NodeLink::Impl::say(const std::string& line) const {
  if (cfg.say) cfg.say("node " + std::to_string(me) + " of " + std::to_string(group_size) + ": " + line);
}

void NodeLink::Impl::poke() {
  if (wake[1] >= 0) {
    const char b = 1;
    // EAGAIN: the pipe is full of pokes already, so the loop wakes anyway.
    [[maybe_unused]] auto n = ::write(wake[1], &b, 1);
  }
}

void NodeLink::Impl::queue(std::string f) {
  {
    std::lock_guard lock(m);
    outbox.push_back(std::move(f));
  }
  poke();
}

bool NodeLink::Impl::is_gone(const Peer& p) const {
  if (p.dropped) return true;
  std::lock_guard lock(m);
  return group.gone(p.node.node_rank);
}

std::string NodeLink::Impl::down_frame(int of_attempt, const NodeDown& d) const {
  return message_frame(LinkKind::down, encode_down(of_attempt, d));
}

void NodeLink::Impl::send_to(Peer& p, const std::string& frame) {
  if (!p.conn.is_open()) return;
  if (p.conn.send(frame) == LinkIo::full && !is_gone(p))
    lost(p, "it stopped reading what this node sends (" + std::to_string(p.conn.output_pending() / 1024) +
                " KiB waiting for it, the most a node may fall behind is " +
                std::to_string(kLinkOutputCap / 1024) + " KiB)");
}

void NodeLink::Impl::send_outbox(const std::vector<std::string>& frames) {
  for (const auto& f : frames)
    for (auto& p : peers) send_to(p, f);
}

void NodeLink::Impl::send_outbox_and_last_words() {
  std::vector<std::string> frames;
  {
    std::lock_guard lock(m);
    frames.swap(outbox);
  }
  send_outbox(frames);
  std::vector<LinkConnection*> listening;
  for (auto& p : peers)
    if (!is_gone(p)) listening.push_back(&p.conn);  // a lost node would only hold us up
  flush_all(listening, Clock::now() + kLastWords);
}

void NodeLink::Impl::report(int of_attempt, const NodeDown& d, int from, const Peer* came_on) {
  bool fresh;
  {
    std::lock_guard lock(m);
    fresh = group.report_down(of_attempt, d, from);
  }
  cv.notify_all();
  if (!fresh) return;
  if (hub()) {
    const std::string f = down_frame(of_attempt, d);
    for (auto& p : peers)
      if (&p != came_on) send_to(p, f);
  }
  if (of_attempt == attempt && on_down) {
    NodeDown heard = d;
    heard.attempt = of_attempt;
    on_down(heard);
  }
}

void NodeLink::Impl::lost(Peer& p, const std::string& why, bool closed) {
  if (closed) p.conn.close();
  {
    std::lock_guard lock(m);
    group.connection_gone(p.node.node_rank);
  }
  NodeDown d{p.node.node_rank, describe_node(p.node) + " was lost: " + why, false};
  d.lost = true;
  report(attempt, d, me, &p);
}

void NodeLink::Impl::end_if_all_done() {
  {
    std::lock_guard lock(m);
    if (!group.should_end(attempt)) return;
    group.end(attempt);
  }
  cv.notify_all();
  const std::string f = link_frame(LinkKind::end, {{"attempt", std::to_string(attempt)}});
  for (auto& p : peers) send_to(p, f);
}

void NodeLink::Impl::on_frame(Peer& p, const Frame& f) {
  const int from = p.node.node_rank;
  switch (static_cast<LinkKind>(f.kind)) {
    case LinkKind::down: {
      const NodeDown d = decode_down(f.payload);  // no attempt: a peer before attempts, so 0
      report(d.attempt, d, from, &p);
      break;
    }
    case LinkKind::done: {
      std::lock_guard lock(m);
      group.report_done(field_int(decode_fields(f.payload)["attempt"], 0), from);
      break;
    }
    case LinkKind::end: {
      std::lock_guard lock(m);
      group.end(field_int(decode_fields(f.payload)["attempt"], 0));
      break;
    }
    case LinkKind::stopped: {  // node 0 hears it
      const Stopped s = decode_stopped(f.payload);
      std::lock_guard lock(m);
      group.report_stopped(s.attempt, from, s.restart, s.leave);
      break;
    }
    case LinkKind::restart: {  // a spoke hears node 0's decision: the next attempt begins now
      Place place = decode_place(f.payload);
      const int next = place.attempt;
      std::lock_guard lock(m);
      if (next == attempt + 1) {
        group.decide(attempt, true);
        attempt = next;
        // An elastic job that went on without lost nodes: this node's place in the new group.
        if (place.nodes < 0) place.nodes = group_size;
        if (place.node_rank < 0) place.node_rank = me;
        const int k = place.nodes, r = place.node_rank;
        if ((k != group_size || r != me) && place_fits(place, cfg.nnodes)) {  // no larger than MAX
          NodeHello self = nodes[static_cast<std::size_t>(me)], zero = nodes[0];
          self.node_rank = r;
          nodes.assign(static_cast<std::size_t>(k), NodeHello{});
          for (int i = 0; i < k; ++i) nodes[static_cast<std::size_t>(i)].node_rank = i;
          nodes[0] = zero;
          nodes[static_cast<std::size_t>(r)] = self;
          me = r;
          group_size = k;
          group.regroup(k, r);
        }
      }
      break;
    }
    case LinkKind::final: {
      std::lock_guard lock(m);
      group.decide(field_int(decode_fields(f.payload)["attempt"], 0), false);
      break;
    }
    case LinkKind::file:
      take_shared_file(decode_fields(f.payload)["text"]);
      break;
    case LinkKind::stacks_ask:
      if (!hub() && stacks.on_ask) {
        auto fields = decode_fields(f.payload);
        stacks.on_ask(static_cast<unsigned>(field_int(fields["seq"], 0)), fields["only"]);
      }
      break;
    case LinkKind::stacks:
      if (hub() && stacks.on_answer) {
        auto fields = decode_fields(f.payload);
        stacks.on_answer(from, static_cast<unsigned>(field_int(fields["seq"], 0)), fields["ranks"]);
      }
      break;
    default:
      break;  // heartbeats (hearing anything is what counts), and kinds of a later version
  }
  cv.notify_all();
  end_if_all_done();
  decide_if_all_stopped();
}

void NodeLink::Impl::on_closed(Peer& p) {
  bool expected;
  {
    std::lock_guard lock(m);
    expected = group.close_expected(attempt, p.node.node_rank);
    if (expected) group.connection_gone(p.node.node_rank);
  }
  if (!expected) return lost(p, "its connection closed (its airhost exited or was killed)", true);
  p.conn.close();
  cv.notify_all();
  end_if_all_done();
}

void NodeLink::Impl::read_from(Peer& p) {
  const LinkIo got = p.conn.receive();
  if (p.conn.bytes_received() != p.heard) {
    p.heard = p.conn.bytes_received();
    p.last_rx = Clock::now();
  }
  try {
    while (auto f = p.conn.next_frame()) on_frame(p, *f);
  } catch (const FrameError& e) {
    return lost(p, std::string("it sent garbage (") + e.what() + ")");
  }
  if (got == LinkIo::closed) on_closed(p);
}

void NodeLink::Impl::loop() {
  auto next_beat = Clock::now();
  auto last_turn = Clock::time_point{};
  std::vector<pollfd> fds;
  const std::string beat = link_frame(LinkKind::heartbeat);
  for (;;) {
    // The lost nodes an elastic job went on without (go_on_without), and the nodes it took in
    // (welcome_newcomers), now that no turn reads the peers.
    std::erase_if(peers, [](const Peer& p) { return p.dropped; });
    for (auto& p : joining) peers.push_back(std::move(p));
    joining.clear();
    if (hub()) grow_check();
    std::vector<std::string> frames;
    bool stopping;
    {
      std::lock_guard lock(m);
      frames.swap(outbox);
      stopping = stop;
    }
    send_outbox(frames);
    if (stopping) return send_outbox_and_last_words();
    end_if_all_done();
    decide_if_all_stopped();

    auto now = Clock::now();
    watch_loop(now);
    if (now >= next_beat) {
      send_shared_file();
      // A node whose loop is stuck beats no more: the beats say its ranks are watched.
      if (!loop_stuck)
        for (auto& p : peers)
          if (!is_gone(p)) send_to(p, beat);
      next_beat = now + heartbeat;
    }
    for (auto& p : peers) {
      if (!p.conn.is_open() || is_gone(p) || now - p.last_rx <= cfg.node_timeout) continue;
      // What waits unread is not silence: a node this host could not listen to (this process
      // was stopped, or busy) may have spoken all along, maybe its last words.
      read_from(p);
      if (p.conn.is_open() && !is_gone(p) && Clock::now() - p.last_rx > cfg.node_timeout)
        lost(p, "nothing heard from it for " + duration_text(cfg.node_timeout) + " (node_timeout)");
    }

    // Listening to every peer still in the group; writing to any with output waiting, lost
    // or not (a frozen node may yet thaw and read why the others stopped).
    fds.assign(1, pollfd{wake[0], POLLIN, 0});
    for (auto& p : peers) {
      const bool gone = is_gone(p);
      const short events = gone ? (p.conn.output_pending() ? POLLOUT : 0) : p.conn.poll_events();
      fds.push_back(pollfd{events ? p.conn.fd() : -1, events, 0});  // poll skips -1
    }
    if (desk) desk->add_poll_fds(fds);  // after the peers: their indexes stay as they are
    // Awake for the next heartbeat, and for the moment the quietest peer passes node_timeout.
    auto wake_at = next_beat;
    if (desk) wake_at = std::min(wake_at, now + milliseconds(100));  // a join's steps, and its deadline
    for (auto& p : peers)
      if (p.conn.is_open() && !is_gone(p)) wake_at = std::min(wake_at, p.last_rx + cfg.node_timeout + milliseconds(1));
    now = Clock::now();
    if (peers.size() >= kCoalesceFromPeers && now - last_turn < kMinTurn) {
      pollfd own{wake[0], POLLIN, 0};
      (void)::poll(&own, 1, static_cast<int>(std::chrono::duration_cast<milliseconds>(kMinTurn - (now - last_turn)).count()) + 1);
      now = Clock::now();
    }
    const auto wait = std::chrono::duration_cast<milliseconds>(wake_at - now).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait, 1, 1000))) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "node link: poll");
    last_turn = Clock::now();
    turns.fetch_add(1, std::memory_order_relaxed);
    if (fds[0].revents) {
      char buf[64];
      while (::read(wake[0], buf, sizeof buf) > 0) {
      }
    }
    for (std::size_t i = 0; i < peers.size(); ++i) {
      Peer& p = peers[i];
      const short revents = fds[i + 1].fd < 0 ? 0 : fds[i + 1].revents;
      if (!revents || !p.conn.is_open()) continue;
      // A write error drops the output; the end of the connection is then read below, or,
      // for a lost node, no longer polled.
      if (p.conn.output_pending()) (void)p.conn.flush();
      if (!is_gone(p) && (revents & (POLLIN | POLLHUP | POLLERR))) read_from(p);
    }
  }
}

void NodeLink::Impl::watch_loop(Clock::time_point now) {
  if (now - last_watched > kLinkThreadAway) loop_silent_since = now;
  last_watched = now;
  const std::int64_t turned = loop_turned.load(std::memory_order_relaxed);
  if (loop_stuck || turned == 0) return;
  const auto silent = now - std::max(Clock::time_point(Clock::duration(turned)), loop_silent_since);
  if (silent <= cfg.node_timeout) return;
  loop_stuck = true;
  const NodeHello& self = nodes[static_cast<std::size_t>(me)];
  const NodeDown d{me,
                   describe_node(self) + " stopped: its airhost's loop has not turned for " +
                       duration_text(std::chrono::duration_cast<milliseconds>(silent)) +
                       " (node_timeout), so nothing watches its ranks (a callback of the embedding program "
                       "that does not return, or a write to a file system that hangs)",
                   false};
  if (!hub()) send_outbox({down_frame(attempt, d)});
  report(attempt, d, me, nullptr);  // node 0 relays it to every other node
}

void NodeLink::Impl::run_loop() noexcept {
  try {
    loop();
  } catch (const std::exception& e) {
    // Only poll() failing gets here (EFAULT, ENOMEM): with no loop, the others cannot be
    // watched, so this node reports itself lost to the launcher, which stops its ranks.
    report(attempt, NodeDown{me, "the node link of " + describe_node(nodes[static_cast<std::size_t>(me)]) + " failed: " + e.what(), false},
           me, nullptr);
  }
}

NodeLink::NodeLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeLink::~NodeLink() = default;

const std::vector<NodeHello>& NodeLink::nodes() const { return impl_->nodes; }

int NodeLink::attempt() const { return impl_->attempt; }
int NodeLink::store_port() const { return impl_->store_port; }
std::vector<std::string> NodeLink::node_names() const {
  std::lock_guard lock(impl_->m);
  std::vector<std::string> out;
  for (const auto& n : impl_->nodes)
    if (!n.host.empty()) out.push_back(describe_node(n));
  return out;
}
int NodeLink::node_rank() const {
  std::lock_guard lock(impl_->m);
  return impl_->me;
}
int NodeLink::nnodes() const {
  std::lock_guard lock(impl_->m);
  return impl_->group_size;
}
std::uint64_t NodeLink::turns() const { return impl_->turns.load(std::memory_order_relaxed); }

bool NodeLink::after_attempt(bool want_restart, milliseconds limit, const std::function<bool()>& cancelled,
                             bool leave) {
  Impl& s = *impl_;
  int of;
  leave = leave && !want_restart && !s.hub();  // node 0 is the hub: it cannot leave its job
  auto say_stopped = [&](bool restart) {
    {
      std::lock_guard lock(s.m);
      if (s.hub()) s.group.report_stopped(of, 0, restart);
    }
    if (s.hub()) s.poke();  // its loop decides once every node has stopped
    else
      s.queue(message_frame(LinkKind::stopped, encode_stopped({of, restart, leave && !restart})));
  };
  {
    std::lock_guard lock(s.m);
    of = s.attempt;
  }
  say_stopped(want_restart);
  // The wait may be long (node 0 waits up to join_timeout for a lost node to come back): a
  // node interrupted meanwhile withdraws, and the job ends everywhere.
  const auto until = limit.count() > 0 ? Clock::now() + limit : Clock::time_point::max();
  auto withdrawn_until = Clock::time_point::max();
  std::unique_lock lock(s.m);
  auto ready = [&] { return s.group.decision(of).has_value() || (!s.hub() && s.group.gone(0)); };
  while (!ready()) {
    const auto now = Clock::now();
    if (now >= until || now >= withdrawn_until) break;
    s.cv.wait_for(lock, milliseconds(100), ready);
    if (ready() || withdrawn_until != Clock::time_point::max() || !cancelled) continue;
    lock.unlock();
    const bool stop = cancelled();
    if (stop && want_restart) say_stopped(false);
    if (stop) withdrawn_until = Clock::now() + std::chrono::seconds(5);
    lock.lock();
  }
  return s.group.decision(of).value_or(false);
}

void NodeLink::start(std::function<void(const NodeDown&)> on_down) {
  Impl& s = *impl_;
  s.on_down = std::move(on_down);
  if (::pipe2(s.wake, O_CLOEXEC | O_NONBLOCK) < 0)
    throw std::system_error(errno, std::generic_category(), "node link: pipe");
  for (auto& p : s.peers) p.last_rx = Clock::now();
  // The thread inherits the mask of the thread that makes it: block everything the host
  // handles for the moment of its creation, so that a SIGINT, SIGTERM or SIGCHLD is never
  // delivered to the link (where it would interrupt a poll and nothing else), only to a
  // thread of the host's, whose loop acts on it.
  const sigset_t blocked = signals_blocked_in_link_thread();
  sigset_t previous;
  if (const int rc = ::pthread_sigmask(SIG_BLOCK, &blocked, &previous); rc != 0)
    throw std::system_error(rc, std::generic_category(), "node link: pthread_sigmask");
  try {
    s.thread = std::thread([&s] { s.run_loop(); });
  } catch (...) {
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // restoring a mask that was in effect cannot fail
}

void NodeLink::loop_alive() noexcept {
  impl_->loop_turned.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

void NodeLink::unwatch_loop() noexcept { impl_->loop_turned.store(0, std::memory_order_relaxed); }

void NodeLink::handle_stacks(StacksHandlers handlers) { impl_->stacks = std::move(handlers); }

void NodeLink::ask_stacks(unsigned seq, const std::string& only) {
  if (impl_->hub()) impl_->queue(link_frame(LinkKind::stacks_ask, {{"seq", std::to_string(seq)}, {"only", only}}));
}

void NodeLink::answer_stacks(unsigned seq, const std::string& ranks) {
  if (!impl_->hub()) impl_->queue(link_frame(LinkKind::stacks, {{"seq", std::to_string(seq)}, {"ranks", ranks}}));
}

void NodeLink::tell_down(const std::string& why, bool cascade, bool timed_out, bool hung) {
  Impl& s = *impl_;
  NodeDown d{s.me, describe_node(s.nodes[static_cast<std::size_t>(s.me)]) + " " + why, cascade};
  d.timed_out = timed_out;
  d.hung = hung;
  s.queue(s.down_frame(s.attempt, d));
}

std::optional<NodeDown> NodeLink::down() const {
  std::lock_guard lock(impl_->m);
  return impl_->group.verdict(impl_->attempt);
}

void NodeLink::wait_followed_nodes(milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lock(s.m);
  s.cv.wait_for(lock, limit, [&] { return s.group.followed_nodes_gone(s.attempt); });
}

std::optional<NodeDown> NodeLink::wait_down(milliseconds limit) {
  Impl& s = *impl_;
  std::unique_lock lock(s.m);
  s.cv.wait_for(lock, limit, [&] { return s.group.real_down(s.attempt) || s.group.quiet(s.attempt); });
  return s.group.verdict(s.attempt);
}

std::optional<NodeDown> NodeLink::finish(milliseconds limit) {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.m);
    s.group.report_done(s.attempt, s.me);
  }
  if (!s.hub()) s.queue(link_frame(LinkKind::done, {{"attempt", std::to_string(s.attempt)}}));
  else s.poke();  // node 0 counts itself done: its loop may now see every node done
  std::unique_lock lock(s.m);
  auto ready = [&] { return s.group.ended(s.attempt) || s.group.any_down(s.attempt); };
  if (limit.count() > 0) s.cv.wait_for(lock, limit, ready);
  else s.cv.wait(lock, ready);
  if (s.group.any_down(s.attempt)) return s.group.verdict(s.attempt);
  if (s.group.ended(s.attempt)) return std::nullopt;
  return NodeDown{-1, "the other nodes did not finish within the run's timeout", false};
}

std::unique_ptr<NodeLink> NodeLink::join(const NodeLinkConfig& config, const std::function<bool()>& cancelled) {
  auto impl = std::make_unique<Impl>(config, join_group(config, cancelled));
  if (impl->hub() && config.nnodes_min > 0) {
    // An elastic job's node 0 listens for the whole run: a node that comes is taken in.
    try {
      impl->desk = std::make_unique<RejoinDesk>(config);
    } catch (const std::exception& e) {
      impl->say(std::string(e.what()) + "; nodes that come while the job runs cannot be taken in");
    }
  }
  impl->heartbeat = config.heartbeat.count() > 0
                        ? config.heartbeat
                        : std::clamp(config.node_timeout / 3, milliseconds(100), milliseconds(1000));
  return std::unique_ptr<NodeLink>(new NodeLink(std::move(impl)));
}

}  // namespace airhost::detail
