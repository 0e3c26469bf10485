// link_auth.cpp — HMAC from the system's libcrypto, nonces, the proofs (link_auth.hpp).
#include "launch/link/link_auth.hpp"

#include <dlfcn.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

namespace airhost::detail {
namespace {

// The three functions airhost uses, with OpenSSL's own signatures (stable from 1.1 to 3.x).
struct Libcrypto {
  const void* (*EVP_sha256)() = nullptr;
  unsigned char* (*HMAC)(const void* md, const void* key, int key_len, const unsigned char* d, std::size_t n,
                         unsigned char* md_out, unsigned int* md_len) = nullptr;
  int (*CRYPTO_memcmp)(const void* a, const void* b, std::size_t len) = nullptr;
  std::string error;
};

const Libcrypto& libcrypto() {
  static Libcrypto lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // Every Python with hashlib has one of these: the node's python3 links it.
    const char* names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"};
    void* h = nullptr;
    for (const char* n : names)
      if ((h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
      lib.error = "the join token needs OpenSSL's libcrypto (libcrypto.so.3 or .so.1.1), which is not on this node; "
                  "install OpenSSL (Debian: libssl3), or run without a join token";
      return;
    }
    lib.EVP_sha256 = reinterpret_cast<decltype(lib.EVP_sha256)>(::dlsym(h, "EVP_sha256"));
    lib.HMAC = reinterpret_cast<decltype(lib.HMAC)>(::dlsym(h, "HMAC"));
    lib.CRYPTO_memcmp = reinterpret_cast<decltype(lib.CRYPTO_memcmp)>(::dlsym(h, "CRYPTO_memcmp"));
    if (!lib.EVP_sha256 || !lib.HMAC || !lib.CRYPTO_memcmp)
      lib.error = "this node's libcrypto lacks HMAC, EVP_sha256 or CRYPTO_memcmp; install OpenSSL 1.1 or 3";
  });
  return lib;
}

std::string hex(const unsigned char* p, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
  return out;
}

// Fields joined so that no two different lists give the same bytes: each with its length.
std::string framed(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) out += std::to_string(p.size()) + ":" + std::string(p) + ";";
  return out;
}

}  // namespace

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  const Libcrypto& lib = libcrypto();
  if (!lib.error.empty()) throw JoinAuthError(lib.error);
  unsigned char md[64];
  unsigned int len = 0;
  if (!lib.HMAC(lib.EVP_sha256(), key.data(), static_cast<int>(key.size()),
                reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len))
    throw JoinAuthError("OpenSSL's HMAC failed");
  return hex(md, len);
}

bool same_digest(std::string_view a, std::string_view b) {
  const Libcrypto& lib = libcrypto();
  if (!lib.error.empty()) throw JoinAuthError(lib.error);
  return a.size() == b.size() && lib.CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string fresh_nonce() {
  unsigned char buf[32];
  std::size_t got = 0;
  while (got < sizeof buf) {
    const ssize_t n = ::getrandom(buf + got, sizeof buf - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw JoinAuthError(std::string("no random bytes for the join's nonce: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  return hex(buf, sizeof buf);
}

std::string hub_proof(std::string_view token, std::string_view node_nonce, std::string_view hub_nonce) {
  return hmac_sha256_hex(token, framed({"airhost node link join v1", "hub", node_nonce, hub_nonce}));
}

std::string node_proof(std::string_view token, std::string_view hub_nonce, std::string_view node_nonce,
                       std::string_view hello_payload) {
  return hmac_sha256_hex(token, framed({"airhost node link join v1", "node", hub_nonce, node_nonce, hello_payload}));
}

std::string read_join_token_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw JoinAuthError("cannot read the join token file " + path + ": " + std::strerror(errno));
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw JoinAuthError("the join token file " + path + " can be read by other users; chmod 600 it");
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line))
    throw JoinAuthError("cannot read the join token file " + path + ", or it is empty");
  const auto b = line.find_first_not_of(" \t\r");
  const auto e = line.find_last_not_of(" \t\r");
  if (b == std::string::npos) throw JoinAuthError("the join token file " + path + " holds no token on its first line");
  return line.substr(b, e - b + 1);
}

}  // namespace airhost::detail
