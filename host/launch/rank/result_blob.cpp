// result_blob.cpp — a rank's result handed over by descriptor (include/airhost/report.hpp).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "airhost/report.hpp"

namespace airhost {
namespace {

constexpr char kMagic[8] = {'A', 'H', 'R', 'E', 'S', 'U', 'L', 'T'};
constexpr std::uint64_t kVersion = 1;
constexpr std::size_t kHeaderSize = 64;

std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void pread_all(int fd, void* into, std::size_t n, std::uint64_t at) {
  auto* p = static_cast<char*>(into);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw std::system_error(errno, std::generic_category(), "cannot read a rank's result");
    if (got == 0) throw std::runtime_error("the result ends early");
    p += got;
    n -= static_cast<std::size_t>(got);
    at += static_cast<std::uint64_t>(got);
  }
}

// A read-only private mapping of the whole blob, unmapped whatever happens.
class Mapping {
 public:
  Mapping(int fd, std::uint64_t size) : size_(size) {
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "cannot map a rank's result");
    data_ = static_cast<const char*>(p);
  }
  ~Mapping() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::string_view at(std::uint64_t offset, std::uint64_t length) const { return {data_ + offset, length}; }

 private:
  const char* data_ = nullptr;
  std::uint64_t size_;
};

}  // namespace

std::shared_ptr<const ResultBlob> ResultBlob::adopt(int fd, std::uint64_t expected_size) {
  std::shared_ptr<ResultBlob> blob(new ResultBlob());
  blob->fd_ = fd;  // closed by the destructor, also when a check below throws
  auto bad = [](const std::string& why) { throw std::runtime_error("not a usable result: " + why); };

  struct stat st{};
  if (::fstat(fd, &st) < 0) throw std::system_error(errno, std::generic_category(), "cannot inspect a rank's result");
  if (!S_ISREG(st.st_mode)) bad("the descriptor is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) != expected_size)
    bad("it holds " + std::to_string(st.st_size) + " bytes, the rank announced " + std::to_string(expected_size));
  blob->size_ = expected_size;
  // Shared memory must be sealed, so that no one (a process the rank forked, say) can change
  // or shrink it under a reader's mapping. A file cannot be sealed; it must have no name, so
  // that no one can open it again, and nothing is left to clean up.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals >= 0) {
    constexpr int kWanted = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
    if ((seals & kWanted) != kWanted) bad("shared memory not sealed against writes and size changes");
    blob->shared_memory_ = true;
  } else if (st.st_nlink != 0) {
    bad("a file that still has a name");
  }

  if (expected_size < kHeaderSize) bad("shorter than its header");
  unsigned char h[kHeaderSize];
  pread_all(fd, h, sizeof h, 0);
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) bad("bad magic");
  if (get_u64(h + 8) != kVersion) bad("layout version " + std::to_string(get_u64(h + 8)) + ", this host reads 1");
  if (get_u64(h + 16) != expected_size) bad("its header gives another size");
  auto within = [&](std::uint64_t off, std::uint64_t len) {
    return off <= expected_size && len <= expected_size - off;
  };
  blob->stream_ = {get_u64(h + 24), get_u64(h + 32)};
  const std::uint64_t table = get_u64(h + 40), count = get_u64(h + 48);
  if (!within(blob->stream_.offset, blob->stream_.length)) bad("its stream lies outside it");
  if (count > expected_size / 16 || !within(table, count * 16)) bad("its buffer table lies outside it");
  std::vector<unsigned char> entries(count * 16);
  if (count) pread_all(fd, entries.data(), entries.size(), table);
  for (std::uint64_t i = 0; i < count; ++i) {
    Span s{get_u64(&entries[i * 16]), get_u64(&entries[i * 16 + 8])};
    if (!within(s.offset, s.length)) bad("buffer " + std::to_string(i) + " lies outside it");
    blob->buffers_.push_back(s);
  }
  return blob;
}

ResultBlob::~ResultBlob() {
  if (fd_ >= 0) ::close(fd_);
}

// Without buffers the stream is the value. With them, a short pickle program that plain
// pickle.loads runs: functools.partial(pickle.loads, buffers=[bytearray, ...])(stream).
// bytearrays, not bytes: the buffers of a mapped result are writable too.
template <typename Sink>
void ResultBlob::emit(Sink&& sink) const {
  const Mapping map(fd_, size_);
  const std::string_view stream = map.at(stream_.offset, stream_.length);
  if (buffers_.empty()) {
    sink(stream);
    return;
  }
  static constexpr char head[] =
      "\x80\x05"                // PROTO 5
      "cfunctools\npartial\n"    // GLOBAL functools.partial
      "cpickle\nloads\n"         // GLOBAL pickle.loads
      "\x85" "R"                 // TUPLE1, REDUCE: partial(pickle.loads)
      "(cpickle\nloads\n)}"      // MARK, func, args (), kwds {}
      "X\x07\x00\x00\x00" "buffers"  // BINUNICODE 'buffers'
      "(";                       // MARK
  sink(std::string_view(head, sizeof head - 1));
  for (const Span& b : buffers_) {
    std::string op = "\x96";  // BYTEARRAY8
    put_u64(op, b.length);
    sink(op);
    sink(map.at(b.offset, b.length));
  }
  std::string mid = "lsNtb";  // LIST, SETITEM, None (no __dict__), TUPLE, BUILD: the partial's state
  mid += '\x8e';              // BINBYTES8: the stream
  put_u64(mid, stream.size());
  sink(mid);
  sink(stream);
  sink(std::string_view("\x85R.", 3));  // TUPLE1, REDUCE: the value; STOP
}

std::string ResultBlob::to_string() const {
  std::string out;
  std::uint64_t need = stream_.length + 64;
  for (const Span& b : buffers_) need += b.length + 9;
  out.reserve(need);
  emit([&](std::string_view piece) { out.append(piece); });
  return out;
}

void ResultBlob::write_to(int out_fd) const {
  emit([&](std::string_view piece) {
    while (!piece.empty()) {
      ssize_t n = ::write(out_fd, piece.data(), piece.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::system_error(errno, std::generic_category(), "cannot write a rank's result");
      piece.remove_prefix(static_cast<std::size_t>(n));
    }
  });
}

}  // namespace airhost
