#include "launch/rank/frames.hpp"

#include <sys/socket.h>

#include <cstdint>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace airhost::detail {
namespace {

template <typename T>
void put_le(std::string& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T get_le(const char* p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string encode_frame_header(std::uint16_t kind, std::uint64_t length) {
  std::string out;
  out.reserve(kFrameHeaderSize);
  put_le<std::uint32_t>(out, kFrameMagic);
  put_le<std::uint16_t>(out, kind);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint64_t>(out, length);
  return out;
}

std::string encode_frame(std::uint16_t kind, std::string_view payload) {
  std::string out = encode_frame_header(kind, payload.size());
  out.append(payload);
  return out;
}

void FrameDecoder::feed(std::string_view bytes) {
  // Compact lazily: keep amortised O(n) without moving a large payload on every read.
  if (consumed_ > 0 && consumed_ >= buffer_.size() / 2) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes);
}

std::optional<Frame> FrameDecoder::next() {
  if (pending() < kFrameHeaderSize) return std::nullopt;
  const char* head = buffer_.data() + consumed_;
  if (get_le<std::uint32_t>(head) != kFrameMagic)
    throw FrameError(channel_ + " corrupted: bad frame magic");
  const auto length = get_le<std::uint64_t>(head + 8);
  if (length > max_length_)
    throw FrameError(channel_ + " corrupted: a frame announces " + std::to_string(length) + " bytes, over the cap of " +
                     std::to_string(max_length_) + " (a stray write into its descriptor?)");
  if (pending() - kFrameHeaderSize < length) {
    buffer_.reserve(consumed_ + kFrameHeaderSize + length);  // one allocation for a big payload
    return std::nullopt;
  }
  Frame f;
  f.kind = get_le<std::uint16_t>(head + 4);
  f.payload.assign(head + kFrameHeaderSize, length);
  consumed_ += kFrameHeaderSize + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return f;
}

std::string encode_fields(const Fields& fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    put_le<std::uint32_t>(out, static_cast<std::uint32_t>(name.size()));
    out += name;
    put_le<std::uint64_t>(out, value.size());
    out += value;
  }
  return out;
}

Fields decode_fields(std::string_view p) {
  Fields fields;
  std::size_t at = 0;
  auto need = [&](std::size_t n) {
    if (p.size() - at < n) throw FrameError("control channel corrupted: truncated field list");
  };
  while (at < p.size()) {
    need(4);
    auto nlen = get_le<std::uint32_t>(p.data() + at);
    at += 4;
    need(nlen);
    std::string name(p.substr(at, nlen));
    at += nlen;
    need(8);
    auto vlen = get_le<std::uint64_t>(p.data() + at);
    at += 8;
    need(vlen);
    fields[std::move(name)] = std::string(p.substr(at, vlen));
    at += vlen;
  }
  return fields;
}

void send_with_fds(int fd, std::string_view bytes, const int* fds, int nfds, const char* what) {
  constexpr int kMaxFds = 4;
  if (nfds < 0 || nfds > kMaxFds) throw std::invalid_argument("send_with_fds: 0 to 4 descriptors");
  std::size_t off = 0;
  while (off < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data() + off), bytes.size() - off};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
    if (nfds > 0 && off == 0) {  // the descriptors travel with the message's first byte
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), what);
    }
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace airhost::detail
