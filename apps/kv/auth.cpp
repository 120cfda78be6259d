#include "auth.hpp"

#include <cstring>

namespace rdmakit::kv {
namespace {

// Every message: magic (u32), one flag or status byte, three zero bytes, then
// a 32-byte nonce or proof.
template <size_t N>
std::vector<std::byte> encode(uint32_t magic, uint8_t flag,
                              const std::array<std::byte, N>& body,
                              std::span<const std::byte> tail = {}) {
  std::vector<std::byte> out(8 + N + tail.size());
  std::memcpy(out.data(), &magic, 4);
  out[4] = std::byte{flag};
  std::memcpy(out.data() + 8, body.data(), N);
  if (!tail.empty()) std::memcpy(out.data() + 8 + N, tail.data(), tail.size());
  return out;
}

// Checks magic, the size (exact unless tail_ok) and the three zero bytes;
// returns the flag byte.
template <size_t N>
std::optional<uint8_t> decode(std::span<const std::byte> in, uint32_t magic,
                              std::array<std::byte, N>* body, bool tail_ok = false) {
  if (in.size() < 8 + N || (!tail_ok && in.size() != 8 + N)) return std::nullopt;
  uint32_t m = 0;
  std::memcpy(&m, in.data(), 4);
  if (m != magic) return std::nullopt;
  if (in[5] != std::byte{0} || in[6] != std::byte{0} || in[7] != std::byte{0})
    return std::nullopt;
  std::memcpy(body->data(), in.data() + 8, N);
  return static_cast<uint8_t>(in[4]);
}

}  // namespace

const char* auth_status_name(AuthStatus status) noexcept {
  switch (status) {
    case AuthStatus::kOk: return "OK";
    case AuthStatus::kNoSecret: return "NO_SECRET";
    case AuthStatus::kWrongSecret: return "WRONG_SECRET";
    case AuthStatus::kMalformed: return "MALFORMED";
  }
  return "UNKNOWN";
}

std::vector<std::byte> encode_hello(const auth::Nonce& client_nonce) {
  return encode(kHelloMagic, 0, client_nonce);
}

std::optional<auth::Nonce> parse_hello(std::span<const std::byte> in) noexcept {
  auth::Nonce n;
  const auto flag = decode(in, kHelloMagic, &n);
  if (!flag || *flag != 0) return std::nullopt;
  return n;
}

std::vector<std::byte> encode_challenge(const Challenge& c) {
  return encode(kChallengeMagic, c.auth_required ? 1 : 0, c.server_nonce);
}

std::optional<Challenge> parse_challenge(std::span<const std::byte> in) noexcept {
  Challenge c;
  const auto flag = decode(in, kChallengeMagic, &c.server_nonce);
  if (!flag || *flag > 1) return std::nullopt;
  c.auth_required = *flag == 1;
  return c;
}

std::vector<std::byte> encode_proof(const ProofMsg& p) {
  return encode(kProofMagic, p.has_secret ? 1 : 0, p.proof);
}

std::optional<ProofMsg> parse_proof(std::span<const std::byte> in) noexcept {
  ProofMsg p;
  const auto flag = decode(in, kProofMagic, &p.proof);
  if (!flag || *flag > 1) return std::nullopt;
  p.has_secret = *flag == 1;
  return p;
}

std::vector<std::byte> encode_welcome(AuthStatus status, const auth::Proof& server_proof,
                                      std::span<const std::byte> table_info) {
  return encode(kWelcomeMagic, static_cast<uint8_t>(status), server_proof,
                status == AuthStatus::kOk ? table_info : std::span<const std::byte>{});
}

std::optional<Welcome> parse_welcome(std::span<const std::byte> in) noexcept {
  Welcome w;
  const auto flag = decode(in, kWelcomeMagic, &w.server_proof, true);
  if (!flag || *flag > static_cast<uint8_t>(AuthStatus::kMalformed)) return std::nullopt;
  w.status = static_cast<AuthStatus>(*flag);
  w.table_info = in.subspan(kWelcomeHeaderBytes);
  if (w.status != AuthStatus::kOk && !w.table_info.empty()) return std::nullopt;
  return w;
}

AuthStatus check_proof(const auth::Secret* secret, const auth::Nonce& client_nonce,
                       const auth::Nonce& server_nonce, const ProofMsg& proof) {
  if (secret == nullptr) return AuthStatus::kOk;  // --no-auth / loopback without one
  if (!proof.has_secret) return AuthStatus::kNoSecret;
  return secret->verify(auth::Role::kClient, kAuthLabel, client_nonce, server_nonce,
                        proof.proof)
             ? AuthStatus::kOk
             : AuthStatus::kWrongSecret;
}

bool is_loopback_host(std::string_view host) noexcept {
  // Drops a ":port" (host:port, [v6]:port) first.
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (host.find(':') != host.rfind(':')) {
    // A bare IPv6 address: keep as it is.
  } else if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  if (!host.starts_with("127.")) return false;
  // 127.a.b.c with digits only.
  int dots = 0;
  for (char c : host) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 3;
}

}  // namespace rdmakit::kv
