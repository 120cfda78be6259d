// Error semantics: RECV too small, RNR, remote access violations, local
// protection errors, and the error state that flushes everything after them.
#include <cstring>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;

class ErrorTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(ErrorTest);

// After an error completion: the QP is in error, and requests posted later
// (plus RECVs posted earlier) all complete with WR_FLUSH_ERROR, in order.
void expect_flushes(Endpoint& ep, const MemoryRegion& local,
                    const RemoteRegion& valid_target,
                    const std::vector<uint64_t>& posted_recv_ids) {
  EXPECT_EQ(ep.qp->state(), QpState::kError);
  fill_pattern(local.data(), 256, 999);
  const std::vector<SendWr> more = {
      rdma_wr(Opcode::kWrite, 91, local, 0, 256, valid_target, 0),
      send_wr(92, local, 0, 16),
  };
  const PostResult r = ep.qp->post_send(more);
  EXPECT_TRUE(r.ok()) << "a QP in error accepts requests (to flush them): "
                      << post_status_name(r.status);
  if (r.ok()) {
    std::vector<Completion> got;
    EXPECT_TRUE(wait_n(*ep.send_cq, more.size(), &got));
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].wr_id, more[i].wr_id);
      EXPECT_EQ(got[i].status, Status::kWrFlushError);
    }
  }
  std::vector<Completion> recvs;
  EXPECT_TRUE(wait_n(*ep.recv_cq, posted_recv_ids.size(), &recvs))
      << "posted RECVs must be flushed";
  for (size_t i = 0; i < recvs.size(); ++i) {
    EXPECT_EQ(recvs[i].wr_id, posted_recv_ids[i]);
    EXPECT_EQ(recvs[i].status, Status::kWrFlushError);
  }
}

TEST_P(ErrorTest, RecvTooSmallIsALengthErrorOnBothSides) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener);
    auto ctl = Control::accept(*ctx, *listener);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 8192, kAccessLocalWrite);
    std::memset(recv.data(), 0x5A, recv.length());
    ASSERT_TRUE(post(*ep.qp, recv_wr(1, *recv.mr, 0, 16)));
    ASSERT_TRUE(post(*ep.qp, recv_wr(2, *recv.mr, 4096, 4096)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
    EXPECT_EQ(c.wr_id, 1u);
    EXPECT_EQ(c.status, Status::kLocalLengthError);
    // The receive QP is in error now, so the next RECV is flushed.
    ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
    EXPECT_EQ(c.wr_id, 2u);
    EXPECT_EQ(c.status, Status::kWrFlushError);
    EXPECT_EQ(ep.qp->state(), QpState::kError);
    EXPECT_TRUE(check_filled(recv.data() + 16, 4096 - 16, 0x5A))
        << "bytes beyond the RECV buffer were written";
    ASSERT_TRUE(ctl->expect("done"));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    fill_pattern(local.data(), 64, 1);
    ASSERT_TRUE(post(*ep.qp, send_wr(7, *local.mr, 0, 64)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 7u);
    EXPECT_EQ(c.status, Status::kRemoteInvalidRequestError);
    EXPECT_EQ(ep.qp->state(), QpState::kError);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

constexpr milliseconds kRnr{200};

TEST_P(ErrorTest, SendWithoutRecvFailsWithRnrAfterTheTimeout) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    QpOptions options = test_qp_options();
    options.rnr_timeout = kRnr;
    Endpoint ep = accept_endpoint(*ctx, *listener, options);
    auto ctl = Control::accept(*ctx, *listener);
    // Deliberately no RECV on the data QP.
    ASSERT_TRUE(ctl->expect("done"));
    Completion c;
    if (ep.recv_cq->poll({&c, 1}) == 1) {
      EXPECT_NE(c.status, Status::kSuccess) << "nothing was posted to receive";
    }
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    QpOptions options = test_qp_options();
    options.rnr_timeout = kRnr;
    Endpoint ep = connect_endpoint(env, *ctx, options);
    auto ctl = Control::connect(env, *ctx);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    const auto start = Clock::now();
    ASSERT_TRUE(post(*ep.qp, send_wr(5, *local.mr, 0, 32)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c, milliseconds(10000)));
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    EXPECT_EQ(c.wr_id, 5u);
    EXPECT_EQ(c.status, Status::kRnrRetryExceeded);
    EXPECT_GE(took, kRnr / 2) << "gave up before rnr_timeout";
    EXPECT_LE(took, milliseconds(3000)) << "rnr_timeout not honoured";
    EXPECT_EQ(ep.qp->state(), QpState::kError);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

// ------------------------------------------------ remote access violations

enum class Violation {
  kBadRkey,
  kOutOfRange,
  kWriteWithoutRemoteWrite,
  kReadWithoutRemoteRead,
  kFetchAddWithoutRemoteAtomic,
  kCompareSwapWithoutRemoteAtomic,
  kDeregisteredHeap,
  kDeregisteredAllocated,
};

// Server regions, in reply order.
enum Region : size_t { kFull, kNoWrite, kNoRead, kNoAtomic, kDoomed, kRegions };
constexpr size_t kRegionLen = 4096;
constexpr uint32_t kAccessOf[kRegions] = {
    kAccessAll,
    kAccessLocalWrite | kAccessRemoteRead | kAccessRemoteAtomic,
    kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteAtomic,
    kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead,
    kAccessAll,
};

void run_violation(const std::string& provider, Violation violation) {
  auto server = [violation](RoleEnv& env) {
    auto ctx = env.open_context();
    std::vector<Buffer> regions;
    std::vector<RemoteRegion> remotes;
    for (size_t i = 0; i < kRegions; ++i) {
      const MemKind kind =
          (i == kDoomed && violation != Violation::kDeregisteredAllocated)
              ? MemKind::kHeap
              : MemKind::kAllocated;
      regions.push_back(make_buffer(*ctx, kind, kRegionLen, kAccessOf[i]));
      fill_pattern(regions[i].data(), kRegionLen, 900 + i);
      remotes.push_back(regions[i].mr->remote());
    }
    const auto reply = pack_regions(remotes);
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    // Deregistering keeps the heap buffer alive so its bytes can be checked.
    regions[kDoomed].mr.reset();
    ASSERT_TRUE(ctl->send("deregistered"));
    ASSERT_TRUE(ctl->expect("done"));
    for (size_t i = 0; i < kRegions; ++i) {
      if (i == kDoomed && violation == Violation::kDeregisteredAllocated) continue;
      const std::byte* bytes = i == kDoomed ? regions[i].heap->data() : regions[i].data();
      EXPECT_TRUE(check_pattern(bytes, kRegionLen, 900 + i))
          << "target memory of region " << i << " was modified";
    }
  };

  auto client = [violation](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const auto remotes = unpack_regions(ep.qp->peer_private_data());
    ASSERT_EQ(remotes.size(), size_t{kRegions});
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 16384, kAccessLocalWrite);
    ASSERT_TRUE(post(*ep.qp, recv_wr(501, *local.mr, 8192, 1024)));
    ASSERT_TRUE(post(*ep.qp, recv_wr(502, *local.mr, 9216, 1024)));
    ASSERT_TRUE(ctl->expect("deregistered"));

    fill_pattern(local.data(), 4096, 42);
    SendWr wr;
    switch (violation) {
      case Violation::kBadRkey: {
        RemoteRegion bad = remotes[kFull];
        bad.rkey = ~bad.rkey;
        wr = rdma_wr(Opcode::kWrite, 1, *local.mr, 0, 64, bad, 0);
        break;
      }
      case Violation::kOutOfRange:
        // Starts inside, ends 32 bytes past the end.
        wr =
            rdma_wr(Opcode::kWrite, 1, *local.mr, 0, 64, remotes[kFull], kRegionLen - 32);
        break;
      case Violation::kWriteWithoutRemoteWrite:
        wr = rdma_wr(Opcode::kWrite, 1, *local.mr, 0, 64, remotes[kNoWrite], 0);
        break;
      case Violation::kReadWithoutRemoteRead:
        wr = rdma_wr(Opcode::kRead, 1, *local.mr, 0, 64, remotes[kNoRead], 0);
        break;
      case Violation::kFetchAddWithoutRemoteAtomic:
        wr = atomic_wr(Opcode::kFetchAdd, 1, *local.mr, 0, remotes[kNoAtomic], 0, 1);
        break;
      case Violation::kCompareSwapWithoutRemoteAtomic:
        wr =
            atomic_wr(Opcode::kCompareSwap, 1, *local.mr, 0, remotes[kNoAtomic], 0, 0, 1);
        break;
      case Violation::kDeregisteredHeap:
      case Violation::kDeregisteredAllocated:
        wr = rdma_wr(Opcode::kWrite, 1, *local.mr, 0, 64, remotes[kDoomed], 0);
        break;
    }
    ASSERT_TRUE(post(*ep.qp, wr));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 1u);
    EXPECT_EQ(c.status, Status::kRemoteAccessError) << opcode_name(wr.opcode);
    expect_flushes(ep, *local.mr, remotes[kFull], {501, 502});
    ASSERT_TRUE(ctl->send("done"));
  };
  run_roles(provider, server, client);
}

TEST_P(ErrorTest, BadRkeyIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kBadRkey);
}
TEST_P(ErrorTest, OutOfRangeIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kOutOfRange);
}
TEST_P(ErrorTest, WriteWithoutRemoteWriteIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kWriteWithoutRemoteWrite);
}
TEST_P(ErrorTest, ReadWithoutRemoteReadIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kReadWithoutRemoteRead);
}
TEST_P(ErrorTest, FetchAddWithoutRemoteAtomicIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kFetchAddWithoutRemoteAtomic);
}
TEST_P(ErrorTest, CompareSwapWithoutRemoteAtomicIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kCompareSwapWithoutRemoteAtomic);
}
TEST_P(ErrorTest, DeregisteredHeapRegionIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kDeregisteredHeap);
}
TEST_P(ErrorTest, DeregisteredAllocatedRegionIsRemoteAccessError) {
  run_violation(GetParam(), Violation::kDeregisteredAllocated);
}

// ------------------------------------------------------ local protection

enum class LocalFault { kWriteBadLkey, kSendPastRegionEnd, kReadPastRegionEnd };

void run_local_fault(const std::string& provider, LocalFault fault) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    fill_pattern(target.data(), 4096, 77);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    ASSERT_TRUE(post(*ep.qp, recv_wr(1, *recv.mr, 0, 4096)));
    ASSERT_TRUE(ctl->expect("done"));
    EXPECT_TRUE(check_pattern(target.data(), 4096, 77)) << "target was modified";
    Completion c;
    if (ep.recv_cq->poll({&c, 1}) == 1) {
      EXPECT_NE(c.status, Status::kSuccess) << "a faulting SEND was delivered";
    }
  };
  auto client = [fault](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    // The registered region is the first page of a two-page heap buffer, so
    // a request straddling its end touches real (unregistered) memory.
    HeapBuffer heap(8192);
    std::memset(heap.data(), 0xC3, 8192);
    auto mr = ctx->register_memory(heap.data(), 4096, kAccessLocalWrite);
    ASSERT_TRUE(post(*ep.qp, recv_wr(601, *mr, 0, 512)));
    SendWr wr;
    switch (fault) {
      case LocalFault::kWriteBadLkey:
        wr = rdma_wr(Opcode::kWrite, 1, *mr, 0, 64, rr, 0);
        wr.lkey = mr->lkey() + 1000003;
        break;
      case LocalFault::kSendPastRegionEnd: wr = send_wr(1, *mr, 4096 - 32, 64); break;
      case LocalFault::kReadPastRegionEnd:
        wr = rdma_wr(Opcode::kRead, 1, *mr, 4096 - 32, 64, rr, 0);
        break;
    }
    ASSERT_TRUE(post(*ep.qp, wr));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 1u);
    EXPECT_EQ(c.status, Status::kLocalProtectionError) << opcode_name(wr.opcode);
    EXPECT_TRUE(check_filled(heap.data() + 4096, 4096, 0xC3))
        << "memory past the registered region was written";
    Buffer spare = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    expect_flushes(ep, *spare.mr, rr, {601});
    ASSERT_TRUE(ctl->send("done"));
  };
  run_roles(provider, server, client);
}

TEST_P(ErrorTest, WrongLkeyIsLocalProtectionError) {
  run_local_fault(GetParam(), LocalFault::kWriteBadLkey);
}
TEST_P(ErrorTest, SendPastLocalRegionIsLocalProtectionError) {
  run_local_fault(GetParam(), LocalFault::kSendPastRegionEnd);
}
TEST_P(ErrorTest, ReadPastLocalRegionIsLocalProtectionError) {
  run_local_fault(GetParam(), LocalFault::kReadPastRegionEnd);
}

}  // namespace
}  // namespace rdmakit::test
