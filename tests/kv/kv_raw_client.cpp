#include "kv_raw_client.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "helpers.hpp"

namespace rdmakit::kv::test {
namespace {

constexpr uint64_t kReplyId = 100;
constexpr size_t kReplyAt = kMaxRequest * 2;

}  // namespace

RawClient::RawClient(rdmakit::test::RoleEnv& env, std::optional<auth::Nonce> nonce) {
  client_nonce = nonce ? *nonce : auth::fresh_nonce();
  ctx = env.open_context();
  cq = ctx->create_cq();
  mr = ctx->allocate(4 * kMaxRequest, kAccessLocalWrite);
  QpOptions o = rdmakit::test::test_qp_options();
  o.send_cq = o.recv_cq = cq.get();
  qp = env.connect(*ctx, o, encode_hello(client_nonce));
  const auto c = parse_challenge(qp->peer_private_data());
  EXPECT_TRUE(c) << "the accept reply is not a kv challenge";
  if (c) challenge = *c;
  // Nothing about the table may come before the proof.
  EXPECT_EQ(qp->peer_private_data().size(), kChallengeBytes);
  post_reply_buffer();
}

void RawClient::post_reply_buffer() {
  EXPECT_TRUE(qp->post_recv({.wr_id = kReplyId,
                             .addr = mr->data() + kReplyAt,
                             .length = static_cast<uint32_t>(kMaxResponse),
                             .lkey = mr->lkey()})
                  .ok());
}

std::span<const std::byte> RawClient::exchange(std::span<const std::byte> bytes) {
  std::memcpy(mr->data(), bytes.data(), bytes.size());
  EXPECT_TRUE(qp->post_send({.wr_id = 1,
                             .opcode = Opcode::kSend,
                             .flags = kSignaled,
                             .length = static_cast<uint32_t>(bytes.size()),
                             .local_addr = mr->data(),
                             .lkey = mr->lkey()})
                  .ok());
  Completion c;
  std::span<const std::byte> reply;
  for (int got = 0; got < 2;) {
    if (!rdmakit::test::wait_one(*cq, &c)) return {};
    if (!c.ok()) return {};
    ++got;
    if (c.wr_id == kReplyId) reply = {mr->data() + kReplyAt, c.byte_len};
  }
  return reply;
}

auth::Proof RawClient::proof_for(const auth::Secret& secret) const {
  return secret.prove(auth::Role::kClient, kAuthLabel, client_nonce,
                      challenge.server_nonce);
}

std::optional<AuthStatus> RawClient::authenticate(
    const std::optional<auth::Proof>& proof) {
  ProofMsg msg;
  if (proof) {
    msg.has_secret = true;
    msg.proof = *proof;
  }
  const auto reply = exchange(encode_proof(msg));
  const auto w = parse_welcome(reply);
  if (!w) return std::nullopt;
  if (w->status == AuthStatus::kOk) {
    const auto info = TableInfo::deserialize(w->table_info);
    EXPECT_TRUE(info) << "no table descriptor after a verified proof";
    if (info) table = *info;
    post_reply_buffer();
  }
  return w->status;
}

void RawClient::login(const auth::Secret& secret) {
  const auto s = authenticate(proof_for(secret));
  ASSERT_TRUE(s) << "no answer to the proof";
  ASSERT_EQ(*s, AuthStatus::kOk) << auth_status_name(*s);
}

std::optional<Response> RawClient::send(std::span<const std::byte> bytes,
                                        std::string* payload) {
  const auto reply = exchange(bytes);
  if (reply.empty()) return std::nullopt;
  auto r = parse_response(reply);
  if (r) payload->assign(r->payload);
  post_reply_buffer();
  return r;
}

bool RawClient::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Completion batch[4];
  while (std::chrono::steady_clock::now() < deadline) {
    if (qp->state() != QpState::kConnected) return true;
    const int n = cq->wait(batch, std::chrono::milliseconds(50));
    for (int i = 0; i < n; ++i)
      if (!batch[i].ok()) return true;
  }
  return qp->state() != QpState::kConnected;
}

}  // namespace rdmakit::kv::test
