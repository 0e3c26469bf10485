// The authenticated join (issue 18): HMAC from the system's libcrypto, and real joins over
// 127.0.0.1 between threads of this process, with strangers on raw sockets that speak the
// protocol as an attacker would: no token, a wrong one, a proof replayed from an earlier join.
#include <doctest/doctest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "airhost/launcher.hpp"
#include "launch/rank/frames.hpp"
#include "launch/link/link_auth.hpp"
#include "launch/link/node_link.hpp"

#include "support.hpp"

using namespace airhost;
using namespace airhost::detail;
using namespace std::chrono_literals;
using airhost_test::free_port;
using airhost_test::TempDir;

namespace {

NodeLinkConfig config(int rank, int port, const std::string& token, std::vector<std::string>* said = nullptr,
                      std::mutex* m = nullptr) {
  NodeLinkConfig c;
  c.node_rank = rank;
  c.nnodes = 2;
  c.nprocs = 1;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.node_timeout = 2s;
  c.join_timeout = 8s;
  c.join_token = token;
  if (said)
    c.say = [said, m](const std::string& line) {
      std::lock_guard l(*m);
      said->push_back(line);
    };
  return c;
}

// A stranger's connection to node 0: it connects, says `hello`, and reads frames as they come.
struct Stranger {
  int fd = -1;
  FrameDecoder frames{"node link"};
  explicit Stranger(int port) {
    for (int i = 0; i < 250 && fd < 0; ++i) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(port));
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
      ::close(fd);
      fd = -1;
      std::this_thread::sleep_for(20ms);
    }
    REQUIRE(fd >= 0);
  }
  ~Stranger() {
    if (fd >= 0) ::close(fd);
  }
  void send(LinkKind kind, const std::string& payload) {
    const std::string f = encode_frame(static_cast<std::uint16_t>(kind), payload);
    REQUIRE(::send(fd, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
  }
  // The next frame within `limit`, or nullopt when the connection closed or nothing came.
  std::optional<Frame> next(std::chrono::milliseconds limit = 5s) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (auto f = frames.next()) return f;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return std::nullopt;
      frames.feed({buf, static_cast<std::size_t>(n)});
    }
    return std::nullopt;
  }
};

NodeHello hello_of(int rank, const std::string& nonce) {
  NodeHello h;
  h.node_rank = rank;
  h.nnodes = 2;
  h.nprocs = 1;
  h.host = "impostor";
  h.nonce = nonce;
  return h;
}

bool said_line(std::mutex& m, const std::vector<std::string>& said, const std::string& part) {
  std::lock_guard l(m);
  for (const auto& s : said)
    if (s.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("HMAC-SHA256 comes from the system's libcrypto and matches RFC 4231") {
  // RFC 4231, test case 2.
  CHECK(hmac_sha256_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(same_digest("abc", "abc"));
  CHECK_FALSE(same_digest("abc", "abd"));
  CHECK_FALSE(same_digest("abc", "abcd"));
  const std::string a = fresh_nonce(), b = fresh_nonce();
  CHECK(a.size() == 64);
  CHECK(a != b);
  // The proofs bind their parts: another nonce, another hello, another side, another digest.
  CHECK(node_proof("t", "n0", "n1", "hello") != node_proof("t", "n0x", "n1", "hello"));
  CHECK(node_proof("t", "n0", "n1", "hello") != node_proof("t", "n0", "n1", "hellp"));
  CHECK(node_proof("t", "n0", "n1", "") != hub_proof("t", "n0", "n1"));
  CHECK(hub_proof("t", "a", "b") != hub_proof("u", "a", "b"));
}

TEST_CASE("a join token file must be private and hold a token") {
  TempDir dir;
  const std::string path = dir.write("token", "  s3cret-token \nsecond line ignored\n");
  ::chmod(path.c_str(), 0600);
  CHECK(read_join_token_file(path) == "s3cret-token");
  ::chmod(path.c_str(), 0644);
  CHECK_THROWS_WITH_AS(read_join_token_file(path), doctest::Contains("can be read by other users; chmod 600 it"),
                       JoinAuthError);
  const std::string empty = dir.write("empty", "\n");
  ::chmod(empty.c_str(), 0600);
  CHECK_THROWS_WITH_AS(read_join_token_file(empty), doctest::Contains("holds no token"), JoinAuthError);
  CHECK_THROWS_WITH_AS(read_join_token_file(dir.path() + "/missing"), doctest::Contains("cannot read the join token file"),
                       JoinAuthError);
}

TEST_CASE("node 0 refuses strangers with no token, a wrong proof or a replayed one, and the real node still joins") {
  const int port = free_port();
  std::mutex m;
  std::vector<std::string> said;
  auto zero = std::async(std::launch::async, [&] { return NodeLink::join(config(0, port, "the-token", &said, &m), {}); });

  // 1. The 25-line impostor of the issue: a well-formed hello for node 1, no token.
  {
    Stranger s(port);
    s.send(LinkKind::hello, encode_hello(hello_of(1, "")));
    auto f = s.next();
    REQUIRE(f);
    CHECK(f->kind == static_cast<std::uint16_t>(LinkKind::refuse));
    CHECK(decode_fields(f->payload)["message"].find("admits only nodes holding this job's join token") !=
          std::string::npos);
    CHECK_FALSE(s.next(1s));  // and it is closed
  }
  // 2. A stranger with a token of its own: node 0 proves itself, the stranger cannot.
  std::string recorded_nonce, recorded_proof, recorded_hello;
  {
    Stranger s(port);
    const std::string nonce = fresh_nonce();
    recorded_hello = encode_hello(hello_of(1, nonce));
    s.send(LinkKind::hello, recorded_hello);
    auto challenge = s.next();
    REQUIRE(challenge);
    REQUIRE(challenge->kind == static_cast<std::uint16_t>(LinkKind::challenge));
    auto fields = decode_fields(challenge->payload);
    CHECK(fields["proof"] == hub_proof("the-token", nonce, fields["nonce"]));  // node 0 holds the token
    CHECK(fields["proof"] != hub_proof("another-token", nonce, fields["nonce"]));
    s.send(LinkKind::proof, encode_fields({{"proof", node_proof("another-token", fields["nonce"], nonce, recorded_hello)}}));
    auto f = s.next();
    REQUIRE(f);
    CHECK(f->kind == static_cast<std::uint16_t>(LinkKind::refuse));
    CHECK(decode_fields(f->payload)["message"].find("refused this node's join token") != std::string::npos);
    // What a listener on the wire could have recorded of a good join: this nonce and a valid
    // proof for it (computed here with the real token, as a real node would have sent).
    recorded_nonce = nonce;
    recorded_proof = node_proof("the-token", fields["nonce"], nonce, recorded_hello);
  }
  // 3. That recorded proof, replayed on a new connection: node 0's nonce is new, so it fails.
  {
    Stranger s(port);
    s.send(LinkKind::hello, recorded_hello);
    auto challenge = s.next();
    REQUIRE(challenge);
    REQUIRE(challenge->kind == static_cast<std::uint16_t>(LinkKind::challenge));
    s.send(LinkKind::proof, encode_fields({{"proof", recorded_proof}}));
    auto f = s.next();
    REQUIRE(f);
    CHECK(f->kind == static_cast<std::uint16_t>(LinkKind::refuse));
  }
  // The real node 1 joins, and node 0 names each refused address in one line.
  auto one = NodeLink::join(config(1, port, "the-token"), {});
  auto hub = zero.get();
  CHECK(hub->nodes().size() == 2);
  CHECK(one->nodes()[0].host == hub->nodes()[0].host);
  CHECK(said_line(m, said, "refused a join from 127.0.0.1 as node 1: it holds no join token"));
  CHECK(said_line(m, said, "refused a join from 127.0.0.1 as node 1: its proof of the join token is wrong"));
  CHECK(said_line(m, said, "node 1 (" ));
  CHECK(said_line(m, said, "joined (its join token checked)"));
  CHECK_FALSE(said_line(m, said, "the join is open"));
  int refusals = 0;
  for (const auto& s : said) refusals += s.find("refused a join") != std::string::npos;
  CHECK(refusals == 3);
  for (const auto& s : said) CHECK(s.find("the-token") == std::string::npos);  // never said, never sent
}

TEST_CASE("a node never joins an impostor node 0, nor one that does not check tokens") {
  SUBCASE("a node 0 that answers the challenge without the token") {
    // A fake node 0: listens, takes the hello and sends a challenge whose proof is not the
    // token's. The node must stop with one sentence before any rank could start.
    const int port = free_port();
    const int l = ::socket(AF_INET, SOCK_STREAM, 0);
    int on = 1;
    ::setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(l, 4) == 0);
    auto fake = std::async(std::launch::async, [l] {
      const int c = ::accept(l, nullptr, nullptr);
      const std::string f = encode_frame(static_cast<std::uint16_t>(LinkKind::challenge),
                                         encode_fields({{"nonce", fresh_nonce()}, {"proof", std::string(64, 'a')}}));
      ::send(c, f.data(), f.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(2s);
      ::close(c);
    });
    CHECK_THROWS_WITH_AS(NodeLink::join(config(1, port, "the-token"), {}),
                         doctest::Contains("could not prove it holds this job's join token"), LaunchError);
    fake.get();
    ::close(l);
  }
  SUBCASE("a node with a token and a node 0 without: both stop, saying to give every node the same token") {
    const int port = free_port();
    auto zero = std::async(std::launch::async, [port] { return NodeLink::join(config(0, port, ""), {}); });
    CHECK_THROWS_WITH_AS(NodeLink::join(config(1, port, "the-token"), {}),
                         doctest::Contains("was given a join token and node 0 was not"), LaunchError);
    CHECK_THROWS_AS(zero.get(), LaunchError);
  }
  SUBCASE("a node without a token and a node 0 with one: the node stops, node 0 waits on for the real one") {
    const int port = free_port();
    auto zero = std::async(std::launch::async, [port] { return NodeLink::join(config(0, port, "the-token"), {}); });
    CHECK_THROWS_WITH_AS(NodeLink::join(config(1, port, ""), {}),
                         doctest::Contains("admits only nodes holding this job's join token"), LaunchError);
    auto one = NodeLink::join(config(1, port, "the-token"), {});
    CHECK(zero.get()->nodes().size() == 2);
  }
}

TEST_CASE("without a token the join is open, as before, and node 0 says so once") {
  const int port = free_port();
  std::mutex m;
  std::vector<std::string> said;
  auto zero = std::async(std::launch::async, [&] { return NodeLink::join(config(0, port, "", &said, &m), {}); });
  auto one = NodeLink::join(config(1, port, ""), {});
  zero.get();
  int open = 0;
  for (const auto& s : said) open += s.find("the join is open: any host that reaches port") != std::string::npos;
  CHECK(open == 1);
}
