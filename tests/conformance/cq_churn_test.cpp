// QPs created and destroyed from one thread while another thread owns (polls)
// the CQ they attach to: a server thread that accepts connections onto the CQ
// its poller drains. The poller's traffic must go on undisturbed, and a
// completion left in the CQ by a destroyed QP must never reach the freed QP
// (ASan) or race with the creating thread (TSan).
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class CqChurnTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(CqChurnTest);

constexpr int kChurnQps = 16;
constexpr uint64_t kChurnTag = uint64_t{1} << 40;
constexpr uint64_t kMinWrites = 64;        // the poller's WRITEs, at least
constexpr size_t kChurnPrivateData = 128;  // past a verbs connect request's room

QpOptions churn_options(CompletionQueue* cq, bool thread_safe) {
  QpOptions options = test_qp_options();
  options.send_cq = cq;
  options.recv_cq = cq;
  options.max_send_wr = 4;
  options.max_recv_wr = 4;
  options.thread_safe = thread_safe;
  return options;
}

TEST_P(CqChurnTest, QpsComeAndGoWhileAnotherThreadPollsTheirCq) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096,
                                kAccessLocalWrite | kAccessRemoteWrite);
    const auto reply = pack_regions({target.mr->remote()});
    Endpoint main = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    auto cq = ctx->create_cq();
    // Accepting onto a CQ another thread polls, with private data too large
    // for a verbs connect request (accept() READs the rest: its completion
    // must go to accept(), not to the poller).
    std::atomic<bool> accepted_all{false};
    std::thread owner([&] {
      Completion c[8];
      while (!accepted_all.load(std::memory_order_acquire)) {
        const int n = cq->poll(c);
        for (int k = 0; k < n; ++k) {
          EXPECT_NE(c[k].wr_id, UINT64_MAX) << "accept()'s own READ reached the poller";
        }
      }
    });
    std::vector<std::unique_ptr<QueuePair>> churn;
    try {
      for (int i = 0; i < kChurnQps; ++i) {
        churn.push_back(
            listener->accept(churn_options(cq.get(), false), control_timeout()));
        EXPECT_EQ(churn.back()->peer_private_data().size(), kChurnPrivateData);
        // On verbs the client's QP must outlive our READ of its private data.
        const auto sent = ctl->send("accepted");
        if (!sent) {
          ADD_FAILURE() << sent.message();
          break;  // the poller thread must still be joined
        }
      }
    } catch (const Error& e) {
      ADD_FAILURE() << "accept " << churn.size() << ": " << e.what();
    }
    accepted_all.store(true, std::memory_order_release);
    owner.join();
    ASSERT_TRUE(ctl->expect("done"));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto shared_cq = ctx->create_cq();
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    QpOptions main_options = test_qp_options();
    main_options.send_cq = shared_cq.get();
    main_options.recv_cq = shared_cq.get();
    auto main = env.connect(*ctx, main_options);
    const RemoteRegion remote = unpack_regions(main->peer_private_data()).at(0);
    auto ctl = Control::connect(env, *ctx);

    // The owner of shared_cq: one signaled 8-byte WRITE at a time on the
    // long-lived QP, polled to completion, until the churn is over.
    std::atomic<bool> churn_done{false};
    uint64_t writes = 0;
    int churn_completions = 0;
    std::thread owner([&] {
      Completion c[8];
      while (!churn_done.load(std::memory_order_acquire) || writes < kMinWrites) {
        ASSERT_TRUE(post(*main, rdma_wr(Opcode::kWrite, writes, *local.mr, 0, 8, remote,
                                        8 * (writes % 64))));
        const auto deadline = std::chrono::steady_clock::now() + wait_timeout();
        bool done = false;
        while (!done) {
          ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "WRITE " << writes;
          const int n = shared_cq->poll(c);
          for (int k = 0; k < n; ++k) {
            if (c[k].wr_id & kChurnTag) {
              // A churn QP's WRITE, possibly completed after its QP was
              // destroyed (then flushed, or dropped as a NIC does).
              EXPECT_TRUE(c[k].status == Status::kSuccess ||
                          c[k].status == Status::kWrFlushError)
                  << status_name(c[k].status);
              ++churn_completions;
              continue;
            }
            ASSERT_EQ(c[k].status, Status::kSuccess) << status_name(c[k].status);
            ASSERT_EQ(c[k].wr_id, writes) << "WRITE completions out of order";
            done = true;
          }
        }
        ++writes;
      }
    });

    // Meanwhile: QPs on the same CQ, created and destroyed by this thread.
    // Every other one is thread-safe and posts a WRITE whose completion the
    // owner may poll after the QP is gone.
    for (int i = 0; i < kChurnQps && !::testing::Test::HasFailure(); ++i) {
      const bool thread_safe = i % 2 == 1;
      const std::vector<std::byte> private_data(kChurnPrivateData, std::byte{0x5a});
      std::unique_ptr<QueuePair> qp;
      try {
        qp = env.connect(*ctx, churn_options(shared_cq.get(), thread_safe), private_data);
      } catch (const Error& e) {
        ADD_FAILURE() << "connect " << i << ": " << e.what();
        break;
      }
      EXPECT_TRUE(ctl->expect("accepted"));
      EXPECT_EQ(qp->state(), QpState::kConnected);
      if (thread_safe) {
        EXPECT_TRUE(post(*qp, rdma_wr(Opcode::kWrite, kChurnTag | i, *local.mr, 64, 8,
                                      remote, 1024 + 8 * i)));
      }
      qp.reset();
    }
    churn_done.store(true, std::memory_order_release);
    owner.join();
    EXPECT_GE(writes, kMinWrites);
    EXPECT_LE(churn_completions, kChurnQps / 2);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

// A CQ admits QPs while the depths attached to it fit its capacity, and a
// destroyed QP gives back exactly what it took: one send depth and one
// receive depth when both sides use this CQ. (shm gave back both depths on
// each of two detaches, so QPs past the capacity were admitted and the ring
// could overwrite completions.)
TEST_P(CqChurnTest, DestroyedQpGivesBackItsCqCapacity) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    auto ctl = Control::accept(*ctx, *listener);
    auto cq = ctx->create_cq();
    std::vector<std::unique_ptr<QueuePair>> qps;
    // Accepts until the client is done: some of its connects fail on its side.
    const auto give_up = std::chrono::steady_clock::now() + control_timeout();
    std::string msg;
    while (!ctl->try_recv(&msg)) {
      ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "client never finished";
      try {
        qps.push_back(
            listener->accept(churn_options(cq.get(), false), milliseconds(100)));
      } catch (const Error&) {
        // accept timed out, or the client's QP was refused after the handshake
      }
      qps.erase(std::remove_if(
                    qps.begin(), qps.end(),
                    [](const auto& qp) { return qp->state() != QpState::kConnected; }),
                qps.end());
    }
    EXPECT_EQ(msg, "done");
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto ctl = Control::connect(env, *ctx);
    // Each QP takes 64 send + 64 receive slots of this CQ: two fit.
    auto cq = ctx->create_cq({.capacity = 256});
    QpOptions options = test_qp_options();
    options.send_cq = cq.get();
    options.recv_cq = cq.get();
    auto first = env.connect(*ctx, options);
    auto second = env.connect(*ctx, options);
    EXPECT_THROW(env.connect(*ctx, options), Error) << "a third QP overflows the CQ";
    first.reset();
    auto third = env.connect(*ctx, options);  // the first one's share came back
    EXPECT_EQ(third->state(), QpState::kConnected);
    EXPECT_THROW(env.connect(*ctx, options), Error)
        << "destroying one QP gave back more than its share";
    second.reset();
    third.reset();
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
