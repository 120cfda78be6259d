// Atomics from two client processes on one 8-byte counter must not lose
// updates: FETCH_ADD with many in flight, and a COMPARE_SWAP increment loop.
#include <atomic>
#include <cstring>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class AtomicTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(AtomicTest);

constexpr int kClients = 2;
constexpr uint64_t kFetchAdds = 100000;  // per client
constexpr uint32_t kInFlight = 16;
constexpr uint64_t kCasIncrements = 2000;  // per client; one in flight
constexpr uint64_t kAddCounter = 0;        // offsets in the server region
constexpr uint64_t kCasCounter = 64;       // separate cache line

uint64_t load(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Counters are read atomically: remote atomics may run on a provider thread
// of this process, ordered with us only through the peers (invisible to TSan).
uint64_t load_counter(std::byte* p) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p)).load();
}

TEST_P(AtomicTest, TwoProcessesContendOnOneCounter) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer counters = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    const uint64_t start = 1ull << 40;  // high bits must survive the adds
    std::memcpy(counters.data() + kAddCounter, &start, 8);
    const auto reply = pack_regions({counters.mr->remote()});
    auto listener = env.listen(*ctx);
    std::vector<Endpoint> eps;
    std::vector<Buffer> inbox;
    for (int i = 0; i < kClients; ++i) {
      eps.push_back(accept_endpoint(*ctx, *listener, test_qp_options(), reply));
      inbox.push_back(make_buffer(*ctx, MemKind::kAllocated, 64, kAccessLocalWrite));
      ASSERT_TRUE(post(*eps.back().qp, recv_wr(1, *inbox.back().mr, 0, 64)));
    }
    for (int i = 0; i < kClients; ++i) {
      Completion c;
      ASSERT_TRUE(wait_one(*eps[i].recv_cq, &c, scaled(milliseconds(60000))))
          << "client " << i << " did not finish";
      ASSERT_EQ(c.status, Status::kSuccess);
    }
    EXPECT_EQ(load_counter(counters.data() + kAddCounter), start + kClients * kFetchAdds)
        << "FETCH_ADD lost updates";
    EXPECT_EQ(load_counter(counters.data() + kCasCounter), kClients * kCasIncrements)
        << "COMPARE_SWAP increments lost updates";
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);

    // FETCH_ADD(1), kInFlight outstanding. Requests on one QP execute in
    // order, so the old values one client sees strictly increase.
    uint64_t posted = 0;
    uint64_t completed = 0;
    uint64_t last_old = 0;
    auto post_add = [&](uint32_t slot) {
      return post(*ep.qp, atomic_wr(Opcode::kFetchAdd, slot, *local.mr, slot * 8, rr,
                                    kAddCounter, 1));
    };
    for (uint32_t slot = 0; slot < kInFlight; ++slot, ++posted) {
      ASSERT_TRUE(post_add(slot));
    }
    std::vector<Completion> batch(kInFlight);
    while (completed < kFetchAdds) {
      const int n = ep.send_cq->wait(batch, wait_timeout());
      ASSERT_GT(n, 0) << "FETCH_ADD stalled after " << completed;
      for (int i = 0; i < n; ++i) {
        const Completion& c = batch[static_cast<size_t>(i)];
        ASSERT_EQ(c.status, Status::kSuccess) << "after " << completed;
        const auto slot = static_cast<uint32_t>(c.wr_id);
        const uint64_t old = load(local.data() + slot * 8);
        if (completed > 0) {
          ASSERT_GT(old, last_old) << "old values went backwards";
        }
        last_old = old;
        ++completed;
        if (posted < kFetchAdds) {
          ASSERT_TRUE(post_add(slot));
          ++posted;
        }
      }
    }

    // CAS increment loop: retry with the value the failed CAS returned.
    uint64_t expected = 0;
    uint64_t done = 0;
    uint64_t attempts = 0;
    constexpr size_t kOld = 512;
    while (done < kCasIncrements) {
      ASSERT_LT(attempts++, 100 * kCasIncrements) << "CAS loop not converging";
      ASSERT_TRUE(post(*ep.qp, atomic_wr(Opcode::kCompareSwap, attempts, *local.mr, kOld,
                                         rr, kCasCounter, expected, expected + 1)));
      Completion c;
      ASSERT_TRUE(wait_one(*ep.send_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      const uint64_t old = load(local.data() + kOld);
      if (old == expected) {
        ++done;
        expected = old + 1;
      } else {
        ASSERT_GT(old, expected) << "the counter only grows";
        expected = old;
      }
    }
    ASSERT_TRUE(post(*ep.qp, send_wr(99, *local.mr, 0, 8)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.status, Status::kSuccess);
  };
  RunOptions options;
  options.clients = kClients;
  options.timeout = std::chrono::seconds(90);
  run(server, client, options);
}

}  // namespace
}  // namespace rdmakit::test
