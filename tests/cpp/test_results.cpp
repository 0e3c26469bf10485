// Results over 64 KiB: handed over by descriptor (airhost::ResultBlob), read as bytes for C++
// callers that keep none, and refused when the descriptor is not a whole, unchangeable result.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "airhost/airhost.hpp"
#include "support.hpp"
#include "base/util.hpp"

using namespace airhost;
using airhost_test::TempDir;

namespace {

LaunchSpec function_spec(const TempDir& dir, const std::string& body, int nprocs) {
  LaunchSpec spec;
  spec.entry.kind = Entry::Kind::function;
  spec.entry.target = dir.write("fn.py", body);
  spec.entry.function = "main";
  spec.nprocs = nprocs;
  spec.rank_binary = airhost_test::rank_binary();
  spec.run_dir = dir.path() + "/run";
  spec.output.forward = false;
  return spec;
}

// What python's json.dumps(list(range(n))) writes.
std::string json_range(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(i);
  return s + "]";
}

std::string u64(std::uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A well-formed blob holding `stream` and no buffers.
std::string blob_bytes(const std::string& stream) {
  std::string b = "AHRESULT" + u64(1) + u64(64 + stream.size()) + u64(64) + u64(stream.size()) +
                  u64(64 + stream.size()) + u64(0) + u64(0);
  return b + stream;
}

int memfd_with(const std::string& bytes, unsigned seals) {
  int fd = ::memfd_create("airhost-result-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  if (seals) REQUIRE(::fcntl(fd, F_ADD_SEALS, seals) == 0);
  return fd;
}

constexpr unsigned kSealed = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;

std::string refusal(int fd, std::uint64_t size) {
  try {
    ResultBlob::adopt(fd, size);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a result over 64 KiB reaches a C++ caller in RankReport::result as before") {
  TempDir dir;
  LaunchSpec spec = function_spec(dir, "def main():\n    return list(range(20000))\n", 2);
  spec.entry.result_format = "json";
  RunReport report = Launcher(spec).run();
  REQUIRE(report.ok());
  for (const auto& r : report.ranks) {
    REQUIRE(r.result.has_value());
    CHECK(r.result->size() > (64u << 10));
    CHECK(*r.result == json_range(20000));
    CHECK(r.result_blob == nullptr);  // read into `result`, and let go
  }
}

TEST_CASE("a launch that keeps result descriptors gets the sealed shared memory itself") {
  TempDir dir;
  LaunchSpec spec = function_spec(dir, "def main():\n    return list(range(20000))\n", 1);
  spec.entry.result_format = "json";
  spec.keep_result_descriptors = true;
  RunReport report = Launcher(spec).run();
  REQUIRE(report.ok());
  const auto& r = report.ranks[0];
  CHECK_FALSE(r.result.has_value());
  REQUIRE(r.result_blob != nullptr);
  CHECK(r.result_blob->in_shared_memory());
  CHECK(r.result_blob->buffer_count() == 0);
  CHECK(r.result_blob->to_string() == json_range(20000));
  CHECK((::fcntl(r.result_blob->fd(), F_GET_SEALS) & F_SEAL_WRITE) != 0);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", r.result_blob->fd());
  char target[256] = {};
  REQUIRE(::readlink(path, target, sizeof target - 1) > 0);
  CHECK(std::string(target).starts_with("/memfd:airhost-result"));
  CHECK(::access((report.run_dir + "/results").c_str(), F_OK) != 0);  // nothing written there
}

TEST_CASE("a pickled result with out-of-band buffers becomes a plain pickle that pickle.loads takes") {
  TempDir dir;
  // A PickleBuffer pickles out of band: the blob holds the stream and one 200 KB buffer.
  LaunchSpec spec = function_spec(dir,
                                  "import os, pickle\n"
                                  "def main():\n"
                                  "    return {'rank': int(os.environ['RANK']),\n"
                                  "            'buf': pickle.PickleBuffer(bytearray(b'ab' * 100000))}\n",
                                  1);
  spec.keep_result_descriptors = true;
  RunReport report = Launcher(spec).run();
  REQUIRE(report.ok());
  const auto& blob = report.ranks[0].result_blob;
  REQUIRE(blob != nullptr);
  CHECK(blob->buffer_count() == 1);
  const std::string pkl = dir.write("value.pkl", blob->to_string());
  const std::string python = default_python();
  REQUIRE_FALSE(python.empty());
  std::string out;
  const int status = detail::run_capture(
      detail::shell_quote(python) +
          " -c 'import pickle, sys; v = pickle.load(open(sys.argv[1], \"rb\")); "
          "print(v[\"rank\"], type(v[\"buf\"]).__name__, bytes(v[\"buf\"]) == b\"ab\" * 100000)' " +
          detail::shell_quote(pkl),
      out);
  CHECK(status == 0);
  CHECK(out == "0 bytearray True\n");
  // write_to streams the same bytes.
  const std::string copy = dir.path() + "/copy.pkl";
  int fd = ::open(copy.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  blob->write_to(fd);
  ::close(fd);
  std::ifstream in(copy, std::ios::binary);
  const std::string again((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(again.size() == blob->to_string().size());
  CHECK((again == blob->to_string()));  // a bool: a failure must not print 200 KB
}

TEST_CASE("a descriptor that is not a whole, unchangeable result is refused, and closed") {
  const std::string good = blob_bytes("{\"ok\": true}");

  SUBCASE("sealed shared memory holding a whole result is taken") {
    auto blob = ResultBlob::adopt(memfd_with(good, kSealed), good.size());
    CHECK(blob->to_string() == "{\"ok\": true}");
    CHECK(blob->in_shared_memory());
  }
  SUBCASE("shared memory that could still change") {
    const int fd = memfd_with(good, 0);
    CHECK(refusal(fd, good.size()).find("not sealed") != std::string::npos);
    CHECK(::fcntl(fd, F_GETFD) < 0);  // closed
  }
  SUBCASE("a size other than the one announced") {
    CHECK(refusal(memfd_with(good, kSealed), good.size() + 1).find("announced") != std::string::npos);
  }
  SUBCASE("a file that still has a name") {
    TempDir dir;
    const std::string path = dir.write("named", good);
    CHECK(refusal(::open(path.c_str(), O_RDONLY | O_CLOEXEC), good.size()).find("name") != std::string::npos);
  }
  SUBCASE("not a regular file") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    CHECK(refusal(p[0], 0).find("not a regular file") != std::string::npos);
    ::close(p[1]);
  }
  SUBCASE("bytes that are not a result") {
    std::string bad = good;
    bad[0] = 'X';
    CHECK(refusal(memfd_with(bad, kSealed), bad.size()).find("magic") != std::string::npos);
  }
  SUBCASE("a buffer table pointing past the end") {
    std::string bad = "AHRESULT" + u64(1) + u64(80) + u64(64) + u64(0) + u64(64) + u64(1) + u64(0) +
                      u64(70) + u64(100);
    CHECK(refusal(memfd_with(bad, kSealed), bad.size()).find("buffer 0") != std::string::npos);
  }
}

TEST_CASE("the host takes a descriptor from the control channel only when it is a whole, sealed result") {
  // A script talks to the channel itself: one well-formed sealed result, then an unsealed one.
  TempDir dir;
  const std::string script = dir.write(
      "send.py",
      "import fcntl, os, struct, sys, _airhost_rank\n"
      "def blob(stream, seal):\n"
      "    fd = os.memfd_create('airhost-result', os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)\n"
      "    os.write(fd, struct.pack('<8s7Q', b'AHRESULT', 1, 64 + len(stream), 64, len(stream), 64 + len(stream), 0, 0) + stream)\n"
      "    if seal:\n"
      "        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)\n"
      "    return fd, 64 + len(stream)\n"
      "fd, size = blob(b'\"' + b'x' * 100000 + b'\"', seal=sys.argv[1] == 'sealed')\n"
      "_airhost_rank.send_result_fd(fd, size, 'shm')\n"
      "os.close(fd)\n");
  for (const std::string how : {"sealed", "unsealed"}) {
    LaunchSpec spec;
    spec.entry.target = script;
    spec.entry.args = {how};
    spec.rank_binary = airhost_test::rank_binary();
    spec.run_dir = dir.path() + "/run-" + how;
    spec.output.forward = false;
    std::string err;
    Callbacks cb;
    cb.on_output = [&](int, Stream s, std::string_view line) {
      if (s == Stream::err) err += std::string(line) + "\n";
    };
    RunReport report = Launcher(spec, cb).run();
    REQUIRE(report.ok());
    if (how == "sealed") {
      REQUIRE(report.ranks[0].result.has_value());
      CHECK(*report.ranks[0].result == "\"" + std::string(100000, 'x') + "\"");
    } else {
      CHECK_FALSE(report.ranks[0].result.has_value());
      // The host's note is in the host log, never among the rank's own lines (issue 22).
      std::ifstream in(report.run_dir + "/logs/host.log");
      const std::string host_log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      CHECK(host_log.find("rank 0: the rank's result is not a usable result: shared memory not sealed") !=
            std::string::npos);
      CHECK(err.find("airhost:") == std::string::npos);
    }
  }
}
