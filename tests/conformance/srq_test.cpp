// Shared receive queues: one pool of RECVs consumed by several QPs, with the
// semantics of include/rdmakit/shared_receive_queue.hpp.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class SrqTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SrqTest);

constexpr uint32_t kSrqDepth = 32;
constexpr uint32_t kBufLen = 1024;
constexpr uint32_t kMessagesPerClient = 300;
constexpr uint32_t kLengths[] = {8, 100, 1000, 17, 0};

// Message j of client k: a 16-byte header (client, j) then a pattern, or
// only the first bytes of the header for short messages.
uint32_t message_length(uint32_t j) { return kLengths[j % std::size(kLengths)]; }
bool message_has_imm(uint32_t j) { return j % 4 == 1; }
uint32_t message_imm(uint32_t client, uint32_t j) { return (client << 16) | j; }

void fill_message(std::byte* p, uint32_t client, uint32_t j) {
  const uint32_t len = message_length(j);
  std::byte header[16] = {};
  std::memcpy(header, &client, 4);
  std::memcpy(header + 4, &j, 4);
  std::memcpy(p, header, std::min<uint32_t>(len, 16));
  if (len > 16) fill_pattern(p + 16, len - 16, client * 100000 + j);
}

// Checks what arrived for message j of client (len bytes at p).
::testing::AssertionResult check_message(const std::byte* p, uint32_t len,
                                         uint32_t client, uint32_t j) {
  if (len != message_length(j)) {
    return ::testing::AssertionFailure()
           << "message " << j << " of client " << client << ": byte_len " << len
           << ", sent " << message_length(j);
  }
  std::byte header[16] = {};
  std::memcpy(header, &client, 4);
  std::memcpy(header + 4, &j, 4);
  if (std::memcmp(p, header, std::min<uint32_t>(len, 16)) != 0) {
    return ::testing::AssertionFailure()
           << "message " << j << " of client " << client << ": wrong header";
  }
  if (len > 16) return check_pattern(p + 16, len - 16, client * 100000 + j);
  return ::testing::AssertionSuccess();
}

QpOptions srq_qp_options(SharedReceiveQueue* srq) {
  QpOptions options = test_qp_options();
  options.srq = srq;
  return options;
}

// Two client processes send 300 messages each (SEND and SEND_WITH_IMM, 0 to
// 1000 bytes, 16 in flight) to two server QPs that share one SRQ of 32
// buffers, replenished as completions arrive. Every completion comes out on
// the recv_cq of the QP the message came through, in that QP's order, with
// the right bytes and immediate, in a buffer taken from the SRQ.
TEST_P(SrqTest, TwoClientsShareOneReceiveQueue) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto srq = ctx->create_srq({.max_wr = kSrqDepth});
    ASSERT_GE(srq->max_wr(), kSrqDepth);
    Buffer bufs =
        make_buffer(*ctx, MemKind::kAllocated, kSrqDepth * kBufLen, kAccessLocalWrite);
    std::memset(bufs.data(), 0xEE, bufs.length());
    for (uint32_t i = 0; i < kSrqDepth; ++i) {
      const PostResult r = srq->post_recv(recv_wr(i, *bufs.mr, i * kBufLen, kBufLen));
      ASSERT_TRUE(r.ok()) << post_status_name(r.status);
    }
    auto listener = env.listen(*ctx);
    Endpoint eps[2];
    uint32_t client_of[2] = {};
    for (int i = 0; i < 2; ++i) {
      eps[i] = accept_endpoint(*ctx, *listener, srq_qp_options(srq.get()));
      ASSERT_EQ(eps[i].qp->peer_private_data().size(), 1u);
      client_of[i] = static_cast<uint32_t>(eps[i].qp->peer_private_data()[0]);
    }
    ASSERT_NE(client_of[0], client_of[1]);
    // A QP on an SRQ has no receive queue of its own.
    Buffer spare = make_buffer(*ctx, MemKind::kAllocated, 64, kAccessLocalWrite);
    EXPECT_EQ(eps[0].qp->post_recv(recv_wr(99, *spare.mr, 0, 64)).status,
              PostStatus::kInvalidArgument);

    uint32_t next_j[2] = {0, 0};
    std::set<uint64_t> outstanding;
    for (uint32_t i = 0; i < kSrqDepth; ++i) outstanding.insert(i);
    const auto deadline = std::chrono::steady_clock::now() + 4 * wait_timeout();
    std::vector<Completion> batch(16);
    while (next_j[0] + next_j[1] < 2 * kMessagesPerClient) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "stalled at " << next_j[0] << " + " << next_j[1] << " messages";
      for (int q = 0; q < 2; ++q) {
        const int n = eps[q].recv_cq->poll(batch);
        ASSERT_GE(n, 0);
        for (int k = 0; k < n; ++k) {
          const Completion& c = batch[static_cast<size_t>(k)];
          ASSERT_EQ(c.status, Status::kSuccess) << c.wr_id;
          ASSERT_EQ(c.opcode, Opcode::kRecv);
          ASSERT_EQ(c.qp_num, eps[q].qp->qp_num()) << "completion on another QP's CQ";
          ASSERT_LT(c.wr_id, kSrqDepth);
          ASSERT_EQ(outstanding.erase(c.wr_id), 1u)
              << "buffer " << c.wr_id << " completed twice";
          const uint32_t j = next_j[q]++;
          const uint32_t client = client_of[q];
          std::byte* p = bufs.data() + c.wr_id * kBufLen;
          ASSERT_TRUE(check_message(p, c.byte_len, client, j)) << "buffer " << c.wr_id;
          ASSERT_EQ(c.has_imm(), message_has_imm(j)) << "message " << j;
          if (c.has_imm()) {
            EXPECT_EQ(c.imm, message_imm(client, j));
          }
          EXPECT_TRUE(check_filled(p + c.byte_len, kBufLen - c.byte_len, 0xEE))
              << "bytes past the message were written";
          std::memset(p, 0xEE, kBufLen);
          ASSERT_TRUE(
              srq->post_recv(recv_wr(c.wr_id, *bufs.mr, c.wr_id * kBufLen, kBufLen))
                  .ok());
          outstanding.insert(c.wr_id);
        }
      }
    }
    // Nothing beyond what was sent.
    for (auto& ep : eps) EXPECT_TRUE(expect_quiet(*ep.recv_cq, milliseconds(100)));
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    const auto me = static_cast<uint32_t>(env.client_index());
    const std::byte id[1] = {static_cast<std::byte>(me)};
    Endpoint ep = connect_endpoint(env, *ctx, test_qp_options(), id);
    constexpr uint32_t kInFlight = 16;
    Buffer msgs =
        make_buffer(*ctx, MemKind::kAllocated, kInFlight * kBufLen, kAccessLocalWrite);
    uint32_t posted = 0;
    uint32_t completed = 0;
    auto post_message = [&](uint32_t slot) {
      const uint32_t j = posted++;
      fill_message(msgs.data() + slot * kBufLen, me, j);
      const SendWr wr = message_has_imm(j)
                            ? send_imm_wr(slot, *msgs.mr, slot * kBufLen,
                                          message_length(j), message_imm(me, j))
                            : send_wr(slot, *msgs.mr, slot * kBufLen, message_length(j));
      return post(*ep.qp, wr);
    };
    for (uint32_t slot = 0; slot < kInFlight; ++slot) ASSERT_TRUE(post_message(slot));
    std::vector<Completion> batch(kInFlight);
    while (completed < kMessagesPerClient) {
      const int n = ep.send_cq->wait(batch, wait_timeout());
      ASSERT_GT(n, 0) << "sends stalled after " << completed;
      for (int k = 0; k < n; ++k) {
        const Completion& c = batch[static_cast<size_t>(k)];
        ASSERT_EQ(c.status, Status::kSuccess) << "after " << completed;
        ++completed;
        if (posted < kMessagesPerClient) {
          ASSERT_TRUE(post_message(static_cast<uint32_t>(c.wr_id)));
        }
      }
    }
  };
  RunOptions options;
  options.clients = 2;
  options.timeout = std::chrono::seconds(60);
  run(server, client, options);
}

// One of two QPs on an SRQ fails (a WRITE with a bad rkey): the SRQ is not
// flushed, its RECVs stay available and serve the other QP's SENDs and
// WRITE_WITH_IMMs in the order they were posted.
TEST_P(SrqTest, AnErrorOnOneQpLeavesTheQueueToTheOthers) {
  constexpr uint32_t kRecvs = 8;
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto srq = ctx->create_srq({.max_wr = 16});
    Buffer bufs =
        make_buffer(*ctx, MemKind::kAllocated, kRecvs * kBufLen, kAccessLocalWrite);
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    std::memset(target.data(), 0x33, target.length());
    for (uint32_t i = 0; i < kRecvs; ++i) {
      ASSERT_TRUE(srq->post_recv(recv_wr(100 + i, *bufs.mr, i * kBufLen, kBufLen)).ok());
    }
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    // The client connects its QPs one after the other: first a, then b.
    Endpoint a = accept_endpoint(*ctx, *listener, srq_qp_options(srq.get()), reply);
    Endpoint b = accept_endpoint(*ctx, *listener, srq_qp_options(srq.get()), reply);
    auto ctl = Control::accept(*ctx, *listener);

    ASSERT_TRUE(ctl->expect("a failed"));
    // Failing QP a must not flush the shared buffers (verbs: SRQ WQEs are
    // not flushed by a QP's error).
    Completion c;
    if (a.recv_cq->poll({&c, 1}) == 1) {
      ADD_FAILURE() << "completion on the failed QP's recv_cq: wr_id " << c.wr_id << " "
                    << status_name(c.status);
    }
    ASSERT_TRUE(ctl->send("go"));
    std::vector<Completion> got;
    ASSERT_TRUE(wait_n(*b.recv_cq, kRecvs, &got));
    for (uint32_t i = 0; i < kRecvs; ++i) {
      const Completion& r = got[i];
      ASSERT_EQ(r.status, Status::kSuccess) << i;
      EXPECT_EQ(r.qp_num, b.qp->qp_num());
      EXPECT_EQ(r.wr_id, 100 + i) << "SRQ buffers are consumed in the order posted";
      if (i % 2 == 0) {
        EXPECT_EQ(r.opcode, Opcode::kRecv);
        EXPECT_EQ(r.byte_len, 64u);
        EXPECT_TRUE(check_pattern(bufs.data() + i * kBufLen, 64, 500 + i));
      } else {
        EXPECT_EQ(r.opcode, Opcode::kRecvWriteWithImm);
        EXPECT_TRUE(r.has_imm());
        EXPECT_EQ(r.imm, 0xC0DE0000u + i);
      }
    }
    EXPECT_TRUE(check_pattern(target.data() + 1024, 32, 777))
        << "WRITE_WITH_IMM payload on the healthy QP";
    EXPECT_TRUE(check_filled(target.data(), 1024, 0x33))
        << "the failed WRITE touched the target";
    EXPECT_TRUE(expect_quiet(*a.recv_cq, milliseconds(100)));
    ASSERT_TRUE(ctl->expect("done"));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint a = connect_endpoint(env, *ctx);
    Endpoint b = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(a.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);

    RemoteRegion bad = rr;
    bad.rkey = ~bad.rkey;
    ASSERT_TRUE(post(*a.qp, rdma_wr(Opcode::kWrite, 1, *local.mr, 0, 64, bad, 0)));
    Completion c;
    ASSERT_TRUE(wait_one(*a.send_cq, &c));
    ASSERT_EQ(c.status, Status::kRemoteAccessError);
    ASSERT_TRUE(ctl->send("a failed"));
    ASSERT_TRUE(ctl->expect("go"));

    fill_pattern(local.data() + 2048, 32, 777);
    for (uint32_t i = 0; i < kRecvs; ++i) {
      if (i % 2 == 0) {
        fill_pattern(local.data() + i * 128, 64, 500 + i);
        ASSERT_TRUE(post(*b.qp, send_wr(i, *local.mr, i * 128, 64)));
      } else {
        SendWr wr = rdma_wr(Opcode::kWriteWithImm, i, *local.mr, 2048, 32, rr, 1024);
        wr.imm = 0xC0DE0000u + i;
        ASSERT_TRUE(post(*b.qp, wr));
      }
    }
    std::vector<Completion> sent;
    ASSERT_TRUE(wait_n(*b.send_cq, kRecvs, &sent));
    for (const Completion& s : sent) EXPECT_EQ(s.status, Status::kSuccess) << s.wr_id;
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

// Capacity is max_wr() outstanding RECVs: one more is QUEUE_FULL, and a
// postlist that crosses the limit reports how many it took.
TEST_P(SrqTest, PostingBeyondCapacityIsQueueFull) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto srq = ctx->create_srq({.max_wr = 16});
    const uint32_t cap = srq->max_wr();
    ASSERT_GE(cap, 16u);
    ASSERT_LE(cap, 4096u) << "unreasonable rounding";
    Buffer bufs = make_buffer(*ctx, MemKind::kAllocated, 64, kAccessLocalWrite);
    std::vector<RecvWr> wrs(cap - 2, recv_wr(1, *bufs.mr, 0, 64));
    PostResult r = srq->post_recv(wrs);
    ASSERT_TRUE(r.ok()) << post_status_name(r.status);
    EXPECT_EQ(r.posted, cap - 2);
    wrs.assign(5, recv_wr(2, *bufs.mr, 0, 64));
    r = srq->post_recv(wrs);
    EXPECT_EQ(r.status, PostStatus::kQueueFull);
    EXPECT_EQ(r.posted, 2u);
    EXPECT_EQ(srq->post_recv(recv_wr(3, *bufs.mr, 0, 64)).status, PostStatus::kQueueFull);
  };
  auto client = [](RoleEnv&) {};
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
