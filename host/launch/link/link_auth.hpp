// link_auth.hpp — the authenticated join: only a node holding the job's token is admitted.
//
// The nodes of a job share a secret, the join token (AIRHOST_JOIN_TOKEN, --join-token-file,
// the `join_token_file` config key). It never crosses the wire: the join is a challenge and
// response over fresh nonces, with HMAC-SHA256 from the system's OpenSSL (libcrypto, loaded
// at run time as the GPU libraries are, so that building airhost needs no OpenSSL headers):
//
//   node k → node 0   hello {..., nonce = Nk}                      (32 random bytes, hex)
//   node 0 → node k   challenge {nonce = N0, proof = HMAC(token, "hub" | Nk | N0)}
//   node k → node 0   proof {proof = HMAC(token, "node" | N0 | Nk | hello)}
//   node 0 → node k   welcome, once every node has joined        (or refuse)
//
// Node 0 proves itself too (a node will not start its ranks for an impostor node 0), and a
// proof is bound to node 0's nonce of this connection, so one recorded from an earlier join
// is refused. What the token does not cover: torch's TCPStore and the collectives' traffic
// (gloo, NCCL) are not authenticated, exactly as under torchrun (docs/multinode.md says what
// to do about it: a private network, a firewall that admits only the job's nodes).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace airhost::detail {

// The token is unusable: empty, or libcrypto cannot be loaded. One sentence.
class JoinAuthError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// HMAC-SHA256 of `data` under `key`, as 64 hex digits. Throws JoinAuthError when libcrypto
// cannot be loaded (the sentence names the libraries tried).
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

// Compares two digests in time independent of where they differ (OpenSSL's CRYPTO_memcmp).
bool same_digest(std::string_view a, std::string_view b);

// 32 bytes from the kernel's random source (getrandom), as 64 hex digits.
std::string fresh_nonce();

// The two proofs of the exchange above.
std::string hub_proof(std::string_view token, std::string_view node_nonce, std::string_view hub_nonce);
std::string node_proof(std::string_view token, std::string_view hub_nonce, std::string_view node_nonce,
                       std::string_view hello_payload);

// The token from a file (its first line, surrounding whitespace trimmed). Throws
// JoinAuthError naming the file when it cannot be read or holds nothing, or is readable by
// other users (say: chmod 600).
std::string read_join_token_file(const std::string& path);

}  // namespace airhost::detail
