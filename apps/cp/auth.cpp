#include "auth.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "protocol.hpp"
#include "report.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {

template <size_t N>
std::string hex(const std::array<std::byte, N>& a) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::byte b : a) {
    s += digits[std::to_integer<unsigned>(b) >> 4];
    s += digits[std::to_integer<unsigned>(b) & 15];
  }
  return s;
}

template <size_t N>
bool unhex(const std::string& s, std::array<std::byte, N>* a) {
  if (s.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    (*a)[i] = std::byte{static_cast<uint8_t>(v)};
  }
  return true;
}

bool send(session::Channel& ch, Writer& w) {
  return ch.send(std::span<const std::byte>(w.data())).ok();
}

}  // namespace

void refuse_hello(session::Channel& ch, uint8_t kind, const std::string& why) {
  Writer w = message(Msg::kHelloReply);
  w.put<uint8_t>(0).put<uint32_t>(0).put<uint8_t>(kind).str(why);
  (void)ch.send(std::span<const std::byte>(w.data()));
}

std::string authenticate_to_server(session::Channel& ch,
                                   const std::optional<auth::Secret>& secret,
                                   std::chrono::milliseconds timeout) {
  const char* replay = std::getenv("RDMAKIT_CP_TEST_AUTH_REPLAY");
  const bool replaying = replay != nullptr && *replay != '\0';
  if (!secret && !replaying) return "";
  auth::Nonce client_nonce = auth::fresh_nonce();
  auth::Proof replayed{};
  if (replaying) {
    std::ifstream in(replay);
    std::string n, p;
    if (!(in >> n >> p) || !unhex(n, &client_nonce) || !unhex(p, &replayed))
      return std::string("test hook: cannot read a nonce and proof from ") + replay;
  }
  Writer hello = message(Msg::kAuthNonce);
  hello.bytes(client_nonce);
  if (!send(ch, hello)) return "connection lost during authentication";
  session::Message m;
  const session::OpResult r = ch.recv(&m, timeout);
  if (!r.ok()) return "no answer during authentication: " + r.detail;
  Reader rd(m.data());
  const auto type = static_cast<Msg>(rd.get<uint8_t>());
  const auto ok = rd.get<uint8_t>();
  if (!rd.ok() || type != Msg::kAuthChallenge)
    return "authentication failed: the server does not authenticate (a server "
           "without a secret, or not an rdmakit-cp server)";
  if (ok == 0) {
    const std::string why = rd.str(1024);
    return "authentication failed: the server has no secret, so it cannot prove "
           "itself (" +
           why + ")";
  }
  auth::Nonce server_nonce{};
  auth::Proof server_proof{};
  const auto n = rd.take(auth::kNonceBytes);
  const auto p = rd.take(auth::kProofBytes);
  if (!rd.ok() || !rd.at_end()) return "authentication failed: malformed challenge";
  std::memcpy(server_nonce.data(), n.data(), n.size());
  std::memcpy(server_proof.data(), p.data(), p.size());
  m.release();
  auth::Proof mine = replayed;
  if (!replaying) {
    if (!secret->verify(auth::Role::kServer, kAuthLabel, client_nonce, server_nonce,
                        server_proof))
      return "authentication failed: wrong secret (the server's proof does not verify: "
             "another secret, or not the server meant)";
    mine = secret->prove(auth::Role::kClient, kAuthLabel, client_nonce, server_nonce);
  }
  Writer proof = message(Msg::kAuthProof);
  proof.bytes(mine);
  if (!send(ch, proof)) return "connection lost during authentication";
  if (const char* rec = std::getenv("RDMAKIT_CP_TEST_AUTH_RECORD"); rec && *rec) {
    std::ofstream out(rec);
    out << hex(client_nonce) << ' ' << hex(mine) << '\n';
  }
  return "";
}

bool authenticate_client(session::Channel& ch, const std::optional<auth::Secret>& secret,
                         session::Message first, session::Message* hello,
                         std::string* why) {
  const uint8_t refused = static_cast<uint8_t>(Failure::kRefused);
  const auto type = first.data().empty() ? Msg{} : static_cast<Msg>(first.data()[0]);
  if (!secret) {
    if (type == Msg::kAuthNonce) {
      // The client wants the server to prove itself, and it cannot.
      Writer w = message(Msg::kAuthChallenge);
      w.put<uint8_t>(0).str("this server runs without a secret");
      (void)send(ch, w);
      *why = "refused: the client has a secret, this server none";
      return false;
    }
    *hello = std::move(first);
    return true;
  }
  if (type != Msg::kAuthNonce) {
    refuse_hello(ch, refused,
                 "the server requires a secret (--secret-file or RDMAKIT_SECRET)");
    *why = "refused: no authentication (the client has no secret)";
    return false;
  }
  Reader rd(first.data());
  rd.get<uint8_t>();
  const auto cn = rd.take(auth::kNonceBytes);
  if (!rd.ok() || !rd.at_end()) {
    refuse_hello(ch, refused, "authentication failed: malformed nonce");
    *why = "refused: malformed authentication nonce";
    return false;
  }
  auth::Nonce client_nonce{};
  std::memcpy(client_nonce.data(), cn.data(), cn.size());
  first.release();
  // Fresh for every client: a recorded client proof answers another nonce.
  const auth::Nonce server_nonce = auth::fresh_nonce();
  Writer w = message(Msg::kAuthChallenge);
  w.put<uint8_t>(1)
      .bytes(server_nonce)
      .bytes(secret->prove(auth::Role::kServer, kAuthLabel, client_nonce, server_nonce));
  if (!send(ch, w)) {
    *why = "gone during authentication";
    return false;
  }
  session::Message m;
  const session::OpResult r = ch.recv(&m, 10s);
  if (!r.ok()) {
    *why = "authentication failed: no proof (" + r.detail +
           "; a client with another secret gives up here)";
    return false;
  }
  Reader pr(m.data());
  const auto ptype = static_cast<Msg>(pr.get<uint8_t>());
  const auto pp = pr.take(auth::kProofBytes);
  auth::Proof proof{};
  if (pr.ok() && pr.at_end() && ptype == Msg::kAuthProof)
    std::memcpy(proof.data(), pp.data(), pp.size());
  m.release();
  if (!pr.ok() || !pr.at_end() || ptype != Msg::kAuthProof ||
      !secret->verify(auth::Role::kClient, kAuthLabel, client_nonce, server_nonce,
                      proof)) {
    refuse_hello(ch, refused, "authentication failed: wrong secret");
    *why = "refused: authentication failed (wrong secret, or a replayed proof)";
    return false;
  }
  const session::OpResult h = ch.recv(hello, 10s);
  if (!h.ok()) {
    *why = "authenticated, then no request: " + h.detail;
    return false;
  }
  return true;
}

}  // namespace rdmakit::cp
