// frames.hpp — the control channel codec between a rank and its host.
//
// The channel is a socketpair inherited by the rank as a file descriptor (never a network
// port); being a Unix socket, it also carries descriptors (FrameKind::result_fd). Each frame
// is a 16-byte header followed by `length` payload bytes:
//
//   offset 0  u32 magic  "AHF1" (0x31464841 little-endian): catches a stray writer early
//   offset 4  u16 kind   FrameKind below; a reader skips kinds it does not know, so new
//                        kinds (heartbeat, metrics, checkpoint notices) need no version bump
//   offset 6  u16 flags  reserved, 0
//   offset 8  u64 length payload size, at most the decoder's cap (kMaxFramePayload): a stray
//                        write into the descriptor, or a corrupted stream, must fail that
//                        channel rather than ask the host for 2^62 bytes. The stream is
//                        drained as it arrives, so no payload has to fit a pipe buffer; results
//                        past 64 KiB travel in a descriptor (result_fd), never in a frame
//
// All integers are little-endian. Structured payloads (errors) are a list of fields, each
// `u32 name length, name, u64 value length, value`, so fields can be added freely too.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace airhost::detail {

enum class FrameKind : std::uint16_t {
  hello = 1,   // reserved: rank → host "the interpreter is up"; no rank sends it yet
  result = 2,  // rank → host: pickled return value of the rank's function
  error = 3,   // rank → host: fields type, message, traceback, pickled, time
  // rank → host: the return value in a descriptor (airhost::ResultBlob), passed with
  // SCM_RIGHTS by the same sendmsg as the frame's first byte; fields size (decimal bytes)
  // and where ("shm" or "file"). It is the only kind that carries a descriptor, so the host
  // matches descriptors to these frames in order. Results of up to 64 KiB come as `result`.
  result_fd = 4,
  // rank → host, empty: the rank answers stacks requests. From then on the host writes each
  // request's number, 4 bytes little endian, on this same channel (the only bytes that go the
  // other way), and a thread of the rank's own rewrites its dump (launch/watch/stacks.hpp).
  stacks_watch = 5,
};

constexpr std::uint32_t kFrameMagic = 0x31464841u;  // "AHF1"
constexpr std::size_t kFrameHeaderSize = 16;
// The largest payload a decoder accepts by default. An error frame (a traceback and a pickled
// exception) is the largest a rank sends; 64 MiB leaves room for an exception that carries
// data, and is still an allocation a host can always make.
constexpr std::uint64_t kMaxFramePayload = 64ull << 20;

struct Frame {
  std::uint16_t kind = 0;
  std::string payload;
};

class FrameError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string encode_frame(std::uint16_t kind, std::string_view payload);
// Just the 16-byte header, for writers that send a large payload without copying it.
std::string encode_frame_header(std::uint16_t kind, std::uint64_t length);
inline std::string encode_frame(FrameKind kind, std::string_view payload) {
  return encode_frame(static_cast<std::uint16_t>(kind), payload);
}

// Incremental decoder: feed() whatever bytes arrived, then pop complete frames.
class FrameDecoder {
 public:
  // `channel` names the stream in errors ("node link corrupted: ..."); a header announcing
  // more than `max_length` payload bytes is an error before anything is reserved for it, so
  // a stray write, a corrupted stream or a peer that is not airhost cannot make the reader
  // ask for 2^62 bytes.
  explicit FrameDecoder(std::string channel = "control channel", std::uint64_t max_length = kMaxFramePayload)
      : channel_(std::move(channel)), max_length_(max_length) {}
  void feed(std::string_view bytes);
  void set_max_length(std::uint64_t max_length) noexcept { max_length_ = max_length; }
  // Throws FrameError on a bad magic or a length over the cap: the stream is then unusable.
  std::optional<Frame> next();
  // Bytes of a frame still incomplete (non-zero at EOF means a truncated frame).
  std::size_t pending() const noexcept { return buffer_.size() - consumed_; }

 private:
  std::string channel_;
  std::uint64_t max_length_;
  std::string buffer_;
  std::size_t consumed_ = 0;
};

// Writes all of `bytes` to the Unix socket `fd` (blocking), `nfds` descriptors (at most 4)
// riding with the first byte (SCM_RIGHTS), so the reader has them by the time the frame they
// belong to is complete. Retries EINTR; throws std::system_error naming `what`. Shared by the
// rank (result_fd frames) and the host (a warm START hands the rank's pipes over).
void send_with_fds(int fd, std::string_view bytes, const int* fds, int nfds, const char* what);

using Fields = std::map<std::string, std::string>;
std::string encode_fields(const Fields& fields);
Fields decode_fields(std::string_view payload);  // throws FrameError when malformed

}  // namespace airhost::detail
