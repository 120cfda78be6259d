#pragma once
// Shared-secret authentication for daemons and rendezvous: mutual
// challenge-response with HMAC-SHA-256 (libsodium) over both sides' fresh
// nonces. The secret never crosses the wire; a recorded exchange cannot be
// replayed (the other side's nonce is new each time), nor reflected (the
// client's and the server's proofs are keyed by role), nor replayed against
// another service (each proof names the service's label).
//
// The exchange, whatever carries it:
//   client -> server  client_nonce
//   server -> client  server_nonce, prove(kServer, ...)   client verifies
//   client -> server  prove(kClient, ...)                  server verifies
// The server serves no request before its verify() succeeds.
// It authenticates the peer; it does not encrypt or sign what follows.
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmakit/export.hpp"

namespace rdmakit::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
// Shortest and longest secret accepted.
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;
using Nonce = std::array<std::byte, kNonceBytes>;
using Proof = std::array<std::byte, kProofBytes>;

enum class Role : unsigned char { kClient = 1, kServer = 2 };

// A random nonce from the kernel's generator.
RDMAKIT_API Nonce fresh_nonce();

class RDMAKIT_API Secret {
 public:
  // A key file: a regular file (not a link) owned by the caller or root,
  // with no group or other permission bits (0600 or 0400), holding
  // kMinSecretBytes..kMaxSecretBytes bytes; one trailing newline is not part
  // of the key. Throws rdmakit::Error naming the path and what is wrong.
  static Secret from_file(const std::string& path);
  // The value of an environment variable; nullopt when unset or empty.
  // Throws rdmakit::Error when it is shorter than kMinSecretBytes.
  static std::optional<Secret> from_env(const char* name);
  // Key bytes the caller already holds (e.g. a fresh random secret handed
  // over a channel it trusts); `origin` names where they came from. Throws
  // rdmakit::Error when the size is outside kMinSecretBytes..kMaxSecretBytes.
  static Secret from_bytes(std::span<const std::byte> key, std::string origin);
  // The usual rule of the tools: a key file when `file` is not empty, else
  // RDMAKIT_SECRET_FILE, else RDMAKIT_SECRET; nullopt when none is given.
  static std::optional<Secret> resolve(const std::string& file);
  // Where the secret came from ("file /etc/rdmakit/cp.key", "RDMAKIT_SECRET").
  const std::string& origin() const noexcept { return origin_; }

  Secret(Secret&&) noexcept = default;
  Secret& operator=(Secret&&) noexcept = default;
  Secret(const Secret&) = delete;
  Secret& operator=(const Secret&) = delete;
  ~Secret();

  // HMAC-SHA-256 over label, role and both nonces.
  Proof prove(Role role, std::string_view label, const Nonce& client,
              const Nonce& server) const;
  // Constant-time comparison with what prove() gives.
  bool verify(Role role, std::string_view label, const Nonce& client, const Nonce& server,
              const Proof& proof) const;

 private:
  Secret(std::vector<std::byte> key, std::string origin);
  std::vector<std::byte> key_;
  std::string origin_;
};

}  // namespace rdmakit::auth
