// test_warm_starter.cpp — the host's side of the warm server's protocol, against a socket that
// plays the server.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cstdint>
#include <string>

#include "base/util.hpp"
#include "launch/rank/frames.hpp"
#include "launch/rank/warm_starter.hpp"

using namespace airhost::detail;

TEST_CASE("a rank whose exit arrives in the same read as its start is still reported") {
  // A rank that returns at once (a trivial function) exits before the host reads the server's
  // STARTED: both frames come in one read, and the exit must not be left in the decoder. It
  // was, and the call waited for the rank forever (1 in about 1000 warm calls under load).
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  auto starter = make_warm_starter(sv[0], 4242);
  const std::string both =
      encode_frame(static_cast<std::uint16_t>(WarmKind::started), encode_fields({{"rank", "0"}, {"pid", "777"}})) +
      encode_frame(static_cast<std::uint16_t>(WarmKind::exited),
                   encode_fields({{"pid", "777"}, {"status", "3"}, {"signal", "0"}}));
  REQUIRE(write_all(sv[1], both));

  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  int out[2], err[2], ctl[2];
  REQUIRE(::pipe(out) == 0);
  REQUIRE(::pipe(err) == 0);
  REQUIRE(::pipe(ctl) == 0);
  RankStartRequest req;
  req.argv = {"airhost-rank"};
  req.stdout_fd = out[1];
  req.stderr_fd = err[1];
  req.control_fd = ctl[1];
  bool exited = false;
  std::int64_t status = -1;
  const int pid = starter->start(&loop, req, [&](std::int64_t s, int) {
    exited = true;
    status = s;
  });
  CHECK(pid == 777);
  for (int i = 0; i < 20 && !exited; ++i) uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(exited);
  CHECK(status == 3);

  starter->close();
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
  for (int fd : {out[0], out[1], err[0], err[1], ctl[0], ctl[1], sv[1]}) ::close(fd);
}
