#pragma once
// rdmakit-kv's handshake: who may use the table (rdmakit/auth.hpp's mutual
// challenge-response, label "rdmakit-kv/1"), and what a client learns before
// and after it proved the secret. Pure encode/parse of the four messages; the
// server and the client do the I/O.
//
//   connect private data  client -> server  Hello      client nonce
//   accept private data   server -> client  Challenge  auth on/off, server nonce
//   first SEND            client -> server  ProofMsg   prove(kClient, cn, sn)
//   its reply (SEND)      server -> client  Welcome    status, prove(kServer, cn, sn),
//                                                      the table's TableInfo (only
//                                                      with status OK)
// The server serves nothing and hands out no descriptor (rkey) before it
// verified the client's proof; the client uses nothing before it verified the
// server's. Both nonces are fresh per connection, so a recorded proof does
// not verify on another connection. The exchange authenticates; it does not
// encrypt what follows.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmakit/auth.hpp"

namespace rdmakit::kv {

inline constexpr std::string_view kAuthLabel = "rdmakit-kv/1";
inline constexpr uint32_t kHelloMagic = 0x3148564bu;      // "KVH1"
inline constexpr uint32_t kChallengeMagic = 0x3143564bu;  // "KVC1"
inline constexpr uint32_t kProofMagic = 0x3150564bu;      // "KVP1"
inline constexpr uint32_t kWelcomeMagic = 0x3157564bu;    // "KVW1"

enum class AuthStatus : uint8_t {
  kOk = 0,
  kNoSecret = 1,     // the server requires a secret, the client has none
  kWrongSecret = 2,  // the proof did not verify (wrong secret, or replayed)
  kMalformed = 3,    // something other than a proof came first
};
const char* auth_status_name(AuthStatus status) noexcept;

struct Challenge {
  bool auth_required = false;
  auth::Nonce server_nonce{};
};

struct ProofMsg {
  bool has_secret = false;
  auth::Proof proof{};
};

struct Welcome {
  AuthStatus status = AuthStatus::kMalformed;
  auth::Proof server_proof{};
  std::span<const std::byte> table_info;  // the serialized TableInfo (OK only)
};

inline constexpr size_t kHelloBytes = 8 + auth::kNonceBytes;
inline constexpr size_t kChallengeBytes = 8 + auth::kNonceBytes;
inline constexpr size_t kProofMsgBytes = 8 + auth::kProofBytes;
inline constexpr size_t kWelcomeHeaderBytes = 8 + auth::kProofBytes;

std::vector<std::byte> encode_hello(const auth::Nonce& client_nonce);
std::optional<auth::Nonce> parse_hello(std::span<const std::byte> in) noexcept;

std::vector<std::byte> encode_challenge(const Challenge& c);
std::optional<Challenge> parse_challenge(std::span<const std::byte> in) noexcept;

std::vector<std::byte> encode_proof(const ProofMsg& p);
std::optional<ProofMsg> parse_proof(std::span<const std::byte> in) noexcept;

// table_info is sent only with kOk.
std::vector<std::byte> encode_welcome(AuthStatus status, const auth::Proof& server_proof,
                                      std::span<const std::byte> table_info);
std::optional<Welcome> parse_welcome(std::span<const std::byte> in) noexcept;

// What the server decides about a proof (pure, for the tests and the fuzzer).
AuthStatus check_proof(const auth::Secret* secret, const auth::Nonce& client_nonce,
                       const auth::Nonce& server_nonce, const ProofMsg& proof);

// True for 127.0.0.0/8, ::1 and "localhost" (a host, or host:port).
bool is_loopback_host(std::string_view host) noexcept;

}  // namespace rdmakit::kv
