// Ordering of a full send queue and selective signaling, including the verbs
// rule that unsignaled slots retire only with a later polled completion.
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class OrderingTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(OrderingTest);

constexpr uint32_t kMaxWrites = 256;
constexpr uint32_t kWriteLen = 16 * 1024;
constexpr size_t kSpareArea = size_t{kMaxWrites} * kWriteLen;  // unchecked writes
constexpr size_t kRegionLen = kSpareArea + 64 * 1024;

// Server side shared by both cases: publish one region, receive one SEND
// carrying the number of WRITEs that preceded it, check them at once (the
// SEND's arrival must imply they all landed), then wait for "done".
void serve_writes_then_send(RoleEnv& env, uint64_t seed_base) {
  auto ctx = env.open_context();
  Buffer target = make_buffer(*ctx, MemKind::kAllocated, kRegionLen, kAccessAll);
  const auto reply = pack_regions({target.mr->remote()});
  auto listener = env.listen(*ctx);
  Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
  auto ctl = Control::accept(*ctx, *listener);
  Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
  ASSERT_TRUE(post(*ep.qp, recv_wr(1, *recv.mr, 0, 4096)));
  Completion c;
  ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
  ASSERT_EQ(c.status, Status::kSuccess);
  ASSERT_EQ(c.byte_len, 4u);
  uint32_t writes = 0;
  std::memcpy(&writes, recv.data(), 4);
  ASSERT_LE(writes, kMaxWrites);
  for (uint32_t i = 0; i < writes; ++i) {
    EXPECT_TRUE(
        check_pattern(target.data() + size_t{i} * kWriteLen, kWriteLen, seed_base + i))
        << "WRITE " << i << " of " << writes
        << " not visible when the SEND behind it arrived";
  }
  ASSERT_TRUE(ctl->send("checked"));
  ASSERT_TRUE(ctl->expect("done"));
}

TEST_P(OrderingTest, FullSendQueueCompletesInOrder) {
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    const uint32_t depth = ep.qp->options().max_send_wr;
    ASSERT_GE(depth, 2u);
    ASSERT_LE(depth - 1, kMaxWrites);
    const uint32_t writes = depth - 1;
    Buffer local = make_buffer(*ctx, MemKind::kHeap, size_t{writes} * kWriteLen + 64,
                               kAccessLocalWrite);
    std::vector<SendWr> wrs;
    for (uint32_t i = 0; i < writes; ++i) {
      fill_pattern(local.data() + size_t{i} * kWriteLen, kWriteLen, 700 + i);
      wrs.push_back(rdma_wr(Opcode::kWrite, 1000 + i, *local.mr, size_t{i} * kWriteLen,
                            kWriteLen, rr, size_t{i} * kWriteLen));
    }
    const size_t count_at = size_t{writes} * kWriteLen;
    std::memcpy(local.data() + count_at, &writes, 4);
    wrs.push_back(send_wr(1000 + writes, *local.mr, count_at, 4));
    // First half one by one, the rest as one postlist; nothing is polled
    // until the whole queue is posted.
    const size_t half = wrs.size() / 2;
    for (size_t i = 0; i < half; ++i) ASSERT_TRUE(post(*ep.qp, wrs[i]));
    const PostResult r = ep.qp->post_send(std::span(wrs).subspan(half));
    ASSERT_TRUE(r.ok()) << post_status_name(r.status);
    ASSERT_EQ(r.posted, wrs.size() - half);

    std::vector<Completion> got;
    ASSERT_TRUE(wait_n(*ep.send_cq, wrs.size(), &got));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].wr_id, wrs[i].wr_id) << "completion " << i << " out of order";
      EXPECT_EQ(got[i].status, Status::kSuccess);
      EXPECT_EQ(got[i].opcode, wrs[i].opcode);
    }
    ASSERT_TRUE(ctl->expect("checked"));
    ASSERT_TRUE(ctl->send("done"));
  };
  run([](RoleEnv& env) { serve_writes_then_send(env, 700); }, client);
}

TEST_P(OrderingTest, SelectiveSignalingAndQueueFull) {
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    const uint32_t depth = ep.qp->options().max_send_wr;
    ASSERT_GE(depth, 2u);
    ASSERT_LE(depth - 1, kMaxWrites);
    const uint32_t writes = depth - 1;
    Buffer local = make_buffer(*ctx, MemKind::kAllocated,
                               size_t{writes} * kWriteLen + 4096, kAccessLocalWrite);

    // N-1 unsignaled WRITEs and one signaled SEND: exactly one completion.
    for (uint32_t i = 0; i < writes; ++i) {
      fill_pattern(local.data() + size_t{i} * kWriteLen, kWriteLen, 800 + i);
      ASSERT_TRUE(
          post(*ep.qp, rdma_wr(Opcode::kWrite, 2000 + i, *local.mr, size_t{i} * kWriteLen,
                               kWriteLen, rr, size_t{i} * kWriteLen, 0)));
    }
    const size_t count_at = size_t{writes} * kWriteLen;
    std::memcpy(local.data() + count_at, &writes, 4);
    ASSERT_TRUE(post(*ep.qp, send_wr(2999, *local.mr, count_at, 4)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 2999u) << "an unsignaled request produced a completion";
    EXPECT_EQ(c.status, Status::kSuccess);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(100)));
    ASSERT_TRUE(ctl->expect("checked"));

    // The queue holds depth requests; signaled or not, none retires until a
    // signaled completion behind it is polled, so one more is QUEUE_FULL.
    auto spare = [&](uint64_t id, uint8_t flags) {
      return rdma_wr(Opcode::kWrite, id, *local.mr, 0, 64, rr, kSpareArea, flags);
    };
    for (uint32_t i = 0; i < writes; ++i) {
      ASSERT_TRUE(post(*ep.qp, spare(3000 + i, 0))) << "request " << i;
    }
    ASSERT_TRUE(post(*ep.qp, spare(3999, kSignaled)));
    // Give the peer time to execute everything: completion, not execution,
    // is what frees the slots.
    std::this_thread::sleep_for(milliseconds(50));
    PostResult r = ep.qp->post_send(spare(4000, kSignaled));
    EXPECT_EQ(r.status, PostStatus::kQueueFull);
    EXPECT_EQ(r.posted, 0u);
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 3999u);
    EXPECT_EQ(c.status, Status::kSuccess);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(20)))
        << "the refused request must not complete";

    // Polling the signaled completion freed the whole queue.
    std::vector<SendWr> again;
    for (uint32_t i = 0; i < writes; ++i) again.push_back(spare(5000 + i, 0));
    again.push_back(spare(5999, kSignaled));
    r = ep.qp->post_send(again);
    EXPECT_TRUE(r.ok()) << post_status_name(r.status);
    EXPECT_EQ(r.posted, again.size());
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 5999u);
    EXPECT_EQ(c.status, Status::kSuccess);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(20)));
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    ASSERT_TRUE(ctl->send("done"));
  };
  run([](RoleEnv& env) { serve_writes_then_send(env, 800); }, client);
}

}  // namespace
}  // namespace rdmakit::test
