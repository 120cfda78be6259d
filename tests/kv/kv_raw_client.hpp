#pragma once
// A kv client that speaks the core API directly and sends what it likes: the
// hostile, silent, unauthenticated and replaying clients of the tests. It
// connects with a hello (a fresh client nonce, or one it is given), keeps the
// server's challenge, and authenticates only when told to, with the proof it
// is told to send.
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "auth.hpp"
#include "harness.hpp"
#include "protocol.hpp"
#include "rdmakit/rdmakit.hpp"
#include "table_layout.hpp"

namespace rdmakit::kv::test {

struct RawClient {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<MemoryRegion> mr;
  std::unique_ptr<QueuePair> qp;
  auth::Nonce client_nonce{};
  Challenge challenge;  // the server's accept reply
  TableInfo table;      // after an authenticate() answered OK

  // Connects with client_nonce (fresh when not given).
  explicit RawClient(rdmakit::test::RoleEnv& env,
                     std::optional<auth::Nonce> nonce = std::nullopt);

  // The proof the genuine client would send with `secret`.
  auth::Proof proof_for(const auth::Secret& secret) const;
  // Sends a proof message (has_secret = proof given) and returns the server's
  // answer (nullopt: none, or not a Welcome). With OK, `table` is set.
  std::optional<AuthStatus> authenticate(const std::optional<auth::Proof>& proof);
  // authenticate() with the proof of `secret`; asserts OK.
  void login(const auth::Secret& secret);

  // Sends bytes; returns the reply (status, payload), reposting the RECV.
  std::optional<Response> send(std::span<const std::byte> bytes, std::string* payload);

  // True once the server closed the connection (a posted RECV flushed, or the
  // QP left kConnected) within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout);

 private:
  // Posts a SEND of bytes and waits for it and the reply in the RECV buffer;
  // returns the reply's bytes (empty: none).
  std::span<const std::byte> exchange(std::span<const std::byte> bytes);
  void post_reply_buffer();
};

}  // namespace rdmakit::kv::test
