#pragma once
// The rdmakit-cp authentication exchange (rdmakit/auth.hpp, label
// "rdmakit-cp/1"), run on the control channel before any request:
//   client -> server  kAuthNonce      client nonce
//   server -> client  kAuthChallenge  1, server nonce, server proof
//                                     (0, reason: the server has no secret)
//   client -> server  kAuthProof      client proof
// then the usual hello. A client without a secret sends its hello at once;
// a server with a secret refuses it. The server's refusals are hello replies
// (Failure::kRefused), so a client sees them where it waits for that reply.
//
// Test hooks (tests/cp/cp_security_test.sh; they give an attacker nothing it
// could not send anyway):
//   RDMAKIT_CP_TEST_AUTH_RECORD=FILE  a client writes its nonce and proof
//                                     (hex) to FILE after an exchange
//   RDMAKIT_CP_TEST_AUTH_REPLAY=FILE  a client sends the nonce and proof read
//                                     from FILE, without a secret and without
//                                     checking the server (a replay attack)
#include <chrono>
#include <optional>
#include <rdmakit/auth.hpp>
#include <rdmakit/session/session.hpp>
#include <string>

namespace rdmakit::cp {

inline constexpr const char* kAuthLabel = "rdmakit-cp/1";

// Client side, right after connecting. Without a secret (and without the
// replay hook) it sends nothing. Returns "" when the server proved it holds
// the secret and our proof is sent, else the reason to give up.
std::string authenticate_to_server(session::Channel& ch,
                                   const std::optional<auth::Secret>& secret,
                                   std::chrono::milliseconds timeout);

// Server side: takes the client's first message. Returns true when the
// hello can be served: *hello is then the client's hello (received after
// the exchange when there was one). False when the client was refused (it
// was told why) or went away; *why is the line for the log.
bool authenticate_client(session::Channel& ch, const std::optional<auth::Secret>& secret,
                         session::Message first, session::Message* hello,
                         std::string* why);

// The hello reply that refuses a client, with a reason (serve.cpp).
void refuse_hello(session::Channel& ch, uint8_t kind, const std::string& why);

}  // namespace rdmakit::cp
