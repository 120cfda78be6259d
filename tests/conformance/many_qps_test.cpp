// Many QPs on one CQ: a poll need not visit every QP every time (shm visits
// the recently active ones and a slice of the rest), but every arrival on
// any of them is seen, in order per QP, whether the owner busy-polls or
// sleeps on the armed CQ between arrivals.
#include <poll.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class ManyQpsTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(ManyQpsTest);

constexpr uint32_t kQps = 48;         // well past the 16 a shm poll visits every time
constexpr uint32_t kRecvs = 16;       // posted per QP
constexpr uint32_t kBusyRounds = 12;  // a message per QP per round, busy-polled
constexpr uint32_t kSlot = 64;

struct Message {
  uint32_t qp;
  uint32_t seq;
};

// Takes `want` messages from the CQ, checking each QP's come in order, and
// re-posts their receives. sleep: arm and sleep on the fd whenever a poll
// finds nothing (the fi_trywait rule), else busy-poll.
::testing::AssertionResult take(CompletionQueue& cq,
                                std::vector<std::unique_ptr<QueuePair>>& qps,
                                const MemoryRegion& mr, std::vector<uint32_t>& next,
                                uint32_t want, bool sleep) {
  const auto give_up = std::chrono::steady_clock::now() + wait_timeout();
  Completion c[16];
  uint32_t got = 0;
  while (got < want) {
    if (std::chrono::steady_clock::now() > give_up)
      return ::testing::AssertionFailure()
             << "got " << got << " of " << want << " messages";
    const int n = cq.poll(c);
    if (n == 0 && sleep && cq.arm()) {
      pollfd p{cq.fd(), POLLIN, 0};
      (void)::poll(&p, 1, 100);
    }
    for (int i = 0; i < n; ++i) {
      if (!c[i].ok() || c[i].opcode != Opcode::kRecv || c[i].byte_len != sizeof(Message))
        return ::testing::AssertionFailure()
               << "unexpected completion " << status_name(c[i].status);
      const auto q = static_cast<uint32_t>(c[i].wr_id >> 32);
      const auto slot = static_cast<uint32_t>(c[i].wr_id);
      Message m;
      std::memcpy(&m, mr.data() + (size_t{q} * kRecvs + slot) * kSlot, sizeof m);
      if (m.qp != q || m.seq != next[q])
        return ::testing::AssertionFailure() << "QP " << q << " got (" << m.qp << ", "
                                             << m.seq << "), expected seq " << next[q];
      ++next[q];
      ++got;
      const PostResult r = qps[q]->post_recv(RecvWr{
          c[i].wr_id, mr.data() + (size_t{q} * kRecvs + slot) * kSlot, kSlot, mr.lkey()});
      if (!r.ok()) return ::testing::AssertionFailure() << "re-post failed";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_P(ManyQpsTest, EveryArrivalOnAnyOfManyQpsSharingACqIsSeen) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    auto cq = ctx->create_cq();
    Buffer slots = make_buffer(*ctx, MemKind::kAllocated, size_t{kQps} * kRecvs * kSlot,
                               kAccessLocalWrite);
    std::vector<std::unique_ptr<QueuePair>> qps;
    for (uint32_t q = 0; q < kQps; ++q) {
      QpOptions options = test_qp_options();
      options.send_cq = cq.get();
      options.recv_cq = cq.get();
      options.max_send_wr = 4;
      options.max_recv_wr = kRecvs;
      qps.push_back(listener->accept(options, control_timeout()));
      ASSERT_TRUE(qps.back());
      for (uint32_t r = 0; r < kRecvs; ++r) {
        ASSERT_TRUE(
            post(*qps.back(), RecvWr{(uint64_t{q} << 32) | r,
                                     slots.data() + (size_t{q} * kRecvs + r) * kSlot,
                                     kSlot, slots.mr->lkey()}));
      }
    }
    auto ctl = Control::accept(*ctx, *listener);
    std::vector<uint32_t> next(kQps, 0);
    ASSERT_TRUE(ctl->send("busy"));
    EXPECT_TRUE(take(*cq, qps, *slots.mr, next, kQps * kBusyRounds, false));
    ASSERT_TRUE(ctl->send("sleep"));
    EXPECT_TRUE(take(*cq, qps, *slots.mr, next, kQps, true));
    ASSERT_TRUE(ctl->expect("done"));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto cq = ctx->create_cq();
    std::vector<std::unique_ptr<QueuePair>> qps;
    for (uint32_t q = 0; q < kQps; ++q) {
      QpOptions options = test_qp_options();
      options.send_cq = cq.get();
      options.recv_cq = cq.get();
      options.max_send_wr = kRecvs;
      options.max_recv_wr = 4;
      qps.push_back(env.connect(*ctx, options));
      ASSERT_TRUE(qps.back());
    }
    auto ctl = Control::connect(env, *ctx);
    std::vector<uint32_t> order(kQps);
    std::iota(order.begin(), order.end(), 0u);
    std::mt19937 rng(7);
    std::vector<uint32_t> seq(kQps, 0);
    auto send_one = [&](uint32_t q) {
      Message m{q, seq[q]++};
      SendWr wr;
      wr.opcode = Opcode::kSend;
      wr.flags = kInline;  // unsignaled: the QPs never fill their send queues
      wr.length = sizeof m;
      wr.local_addr = &m;
      return post(*qps[q], wr);
    };
    Completion drain[16];
    ASSERT_TRUE(ctl->expect("busy"));
    // Rounds in a different order each: QPs go quiet for a while, then speak.
    for (uint32_t round = 0; round < kBusyRounds; ++round) {
      std::shuffle(order.begin(), order.end(), rng);
      for (uint32_t q : order) ASSERT_TRUE(send_one(q));
      (void)cq->poll(drain);
    }
    ASSERT_TRUE(ctl->expect("sleep"));
    // One at a time, with pauses the server sleeps through.
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t q : order) {
      ASSERT_TRUE(send_one(q));
      std::this_thread::sleep_for(milliseconds(1));
    }
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
