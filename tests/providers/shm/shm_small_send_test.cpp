// The small-SEND fast path (try_small_send) must be indistinguishable from
// the general path: the same post-time refusals, the same completions and
// errors, and a clean fall-back when no RECV is posted yet.
#include <gtest/gtest.h>

#include <cstring>

#include "rdmakit/rdmakit.hpp"
#include "shm_in_process.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;

SendWr small_send(Connected& c, uint32_t length, uint8_t flags) {
  return SendWr{.wr_id = 42,
                .opcode = Opcode::kSend,
                .flags = flags,
                .length = length,
                .local_addr = c.mem->data(),
                .lkey = c.mem->lkey()};
}

RecvWr recv_at(Connected& c, uint32_t length) {
  return RecvWr{
      .wr_id = 7, .addr = c.mem->data() + 4096, .length = length, .lkey = c.mem->lkey()};
}

// Polls until `want` completions arrived (or 2 s passed).
std::vector<Completion> poll_n(CompletionQueue& cq, size_t want) {
  std::vector<Completion> got;
  const auto give_up = std::chrono::steady_clock::now() + 2s;
  Completion c[4];
  while (got.size() < want && std::chrono::steady_clock::now() < give_up) {
    const int n = cq.poll(c);
    got.insert(got.end(), c, c + n);
  }
  return got;
}

TEST(ShmSmallSendTest, InlinePastMaxInlineIsRefusedEvenWhenItFitsASlot) {
  Connected c = connect_in_process(/*max_inline=*/8);
  ASSERT_TRUE(c.b->post_recv(recv_at(c, 64)).ok());
  const PostResult r = c.a->post_send(small_send(c, 16, kInline | kSignaled));
  EXPECT_EQ(r.status, PostStatus::kInlineTooLarge) << post_status_name(r.status);
  EXPECT_EQ(r.posted, 0u);
  EXPECT_TRUE(c.a->post_send(small_send(c, 8, kInline | kSignaled)).ok());
  const auto got = poll_n(*c.cq, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Completion& x : got) EXPECT_EQ(x.status, Status::kSuccess);
}

TEST(ShmSmallSendTest, DeliversPayloadImmediateAndSignaledCompletion) {
  Connected c = connect_in_process();
  ASSERT_TRUE(c.b->post_recv(recv_at(c, 64)).ok());
  std::memcpy(c.mem->data(), "nineteen bytes, ok!", 19);
  SendWr wr = small_send(c, 19, kInline | kSignaled);
  wr.opcode = Opcode::kSendWithImm;
  wr.imm = 0xfeed;
  ASSERT_TRUE(c.a->post_send(wr).ok());
  std::memset(c.mem->data(), 0, 19);  // inline: the buffer is ours again
  const auto got = poll_n(*c.cq, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Completion& x : got) {
    ASSERT_EQ(x.status, Status::kSuccess);
    if (x.opcode == Opcode::kRecv) {
      EXPECT_EQ(x.byte_len, 19u);
      EXPECT_TRUE(x.has_imm());
      EXPECT_EQ(x.imm, 0xfeedu);
      EXPECT_EQ(std::memcmp(c.mem->data() + 4096, "nineteen bytes, ok!", 19), 0);
    } else {
      EXPECT_EQ(x.opcode, Opcode::kSendWithImm);
      EXPECT_EQ(x.wr_id, 42u);
    }
  }
}

TEST(ShmSmallSendTest, TooSmallRecvFailsBothSidesAsOnANic) {
  Connected c = connect_in_process();
  ASSERT_TRUE(c.b->post_recv(recv_at(c, 4)).ok());
  ASSERT_TRUE(c.a->post_send(small_send(c, 8, kInline | kSignaled)).ok());
  const auto got = poll_n(*c.cq, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Completion& x : got) {
    if (x.opcode == Opcode::kRecv) {
      EXPECT_EQ(x.status, Status::kLocalLengthError) << status_name(x.status);
    } else {
      EXPECT_EQ(x.status, Status::kRemoteInvalidRequestError) << status_name(x.status);
    }
  }
}

TEST(ShmSmallSendTest, WithoutARecvItWaitsAndIsDeliveredOnceOneIsPosted) {
  Connected c = connect_in_process();
  ASSERT_TRUE(c.a->post_send(small_send(c, 8, kInline | kSignaled)).ok());
  Completion none[2];
  EXPECT_EQ(c.cq->poll(none), 0);  // RNR: queued, retried on poll
  ASSERT_TRUE(c.b->post_recv(recv_at(c, 64)).ok());
  const auto got = poll_n(*c.cq, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const Completion& x : got) EXPECT_EQ(x.status, Status::kSuccess);
}

}  // namespace
}  // namespace rdmakit::shm
