// Every opcode with byte-exact data checks, INLINE sends and immediates.
#include <atomic>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class OpcodeTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(OpcodeTest);

// Target region layout (one per memory kind).
constexpr size_t kWriteArea = 0;      // WRITE lands at +kWriteOffset
constexpr size_t kWriteOffset = 100;  // deliberately unaligned
constexpr size_t kWriteLen = 5000;
constexpr size_t kReadArea = 16 * 1024;  // READ source, pattern
constexpr size_t kReadLen = 6000;
constexpr size_t kCounter = 32 * 1024;       // 8-byte atomic target
constexpr size_t kImmArea = 32 * 1024 + 64;  // WRITE_WITH_IMM target
constexpr size_t kImmLen = 3000;
constexpr size_t kRegionLen = 48 * 1024;
constexpr size_t kRecvSlot = 8 * 1024;

constexpr MemKind kKinds[] = {MemKind::kAllocated, MemKind::kHeap};

uint64_t read_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The target of remote atomics is read atomically: a provider may run them
// on a thread of this process, synchronized with us only through the peer
// process, which TSan cannot see.
uint64_t load_atomic_target(std::byte* p) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p)).load();
}

// Waits for the send completion of wr and checks status, wr_id and opcode.
void expect_send_done(Endpoint& ep, const SendWr& wr) {
  Completion c;
  ASSERT_TRUE(wait_one(*ep.send_cq, &c)) << opcode_name(wr.opcode);
  EXPECT_EQ(c.status, Status::kSuccess) << opcode_name(wr.opcode);
  EXPECT_EQ(c.wr_id, wr.wr_id);
  EXPECT_EQ(c.qp_num, ep.qp->qp_num());
  // Verbs reports SEND for SEND_WITH_IMM and RDMA_WRITE for WRITE_WITH_IMM on
  // the send side, so the immediate variants may report their base opcode.
  switch (wr.opcode) {
    case Opcode::kSendWithImm:
      EXPECT_TRUE(c.opcode == Opcode::kSend || c.opcode == Opcode::kSendWithImm)
          << opcode_name(c.opcode);
      break;
    case Opcode::kWriteWithImm:
      EXPECT_TRUE(c.opcode == Opcode::kWrite || c.opcode == Opcode::kWriteWithImm)
          << opcode_name(c.opcode);
      break;
    default: EXPECT_EQ(c.opcode, wr.opcode);
  }
}

TEST_P(OpcodeTest, EveryOpcodeMovesTheRightBytes) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    std::vector<Buffer> targets;
    std::vector<RemoteRegion> remotes;
    for (size_t k = 0; k < 2; ++k) {
      targets.push_back(make_buffer(*ctx, kKinds[k], kRegionLen, kAccessAll));
      fill_pattern(targets[k].data() + kReadArea, kReadLen, 200 + k);
      const uint64_t initial = 1000 + k;
      std::memcpy(targets[k].data() + kCounter, &initial, 8);
      remotes.push_back(targets[k].mr->remote());
    }
    const auto reply = pack_regions(remotes);
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    Buffer recv =
        make_buffer(*ctx, MemKind::kAllocated, 6 * kRecvSlot, kAccessLocalWrite);
    for (uint64_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * kRecvSlot, kRecvSlot)));
    }
    for (size_t k = 0; k < 2; ++k) {
      SCOPED_TRACE(mem_kind_name(kKinds[k]));
      std::byte* base = targets[k].data();
      Completion c;
      // SEND -> plain RECV.
      ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.wr_id, 3 * k);
      EXPECT_EQ(c.opcode, Opcode::kRecv);
      EXPECT_FALSE(c.has_imm());
      EXPECT_EQ(c.byte_len, 1000u);
      EXPECT_EQ(c.qp_num, ep.qp->qp_num());
      EXPECT_TRUE(check_pattern(recv.data() + (3 * k) * kRecvSlot, 1000, 10 + k));
      // SEND_WITH_IMM -> RECV with the immediate.
      ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.wr_id, 3 * k + 1);
      EXPECT_EQ(c.opcode, Opcode::kRecv);
      EXPECT_TRUE(c.has_imm());
      EXPECT_EQ(c.imm, 0xABC0u + k);
      EXPECT_EQ(c.byte_len, 777u);
      EXPECT_TRUE(check_pattern(recv.data() + (3 * k + 1) * kRecvSlot, 777, 20 + k));
      // WRITE_WITH_IMM -> RECV_WRITE_WITH_IMM; its data is visible by now.
      ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.wr_id, 3 * k + 2);
      EXPECT_EQ(c.opcode, Opcode::kRecvWriteWithImm);
      EXPECT_TRUE(c.has_imm());
      EXPECT_EQ(c.imm, 0x5150u + k);
      EXPECT_EQ(c.byte_len, kImmLen);
      EXPECT_TRUE(check_pattern(base + kImmArea, kImmLen, 40 + k));

      ASSERT_TRUE(ctl->expect("done"));
      EXPECT_TRUE(check_filled(base + kWriteArea, kWriteOffset, 0));
      EXPECT_TRUE(check_pattern(base + kWriteOffset, kWriteLen, 30 + k));
      EXPECT_TRUE(check_filled(base + kWriteOffset + kWriteLen,
                               kReadArea - kWriteOffset - kWriteLen, 0));
      EXPECT_TRUE(check_pattern(base + kReadArea, kReadLen, 200 + k))
          << "READ source modified";
      EXPECT_EQ(load_atomic_target(base + kCounter), 5007u + k);
      ASSERT_TRUE(ctl->send("checked"));
    }
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const auto remotes = unpack_regions(ep.qp->peer_private_data());
    ASSERT_EQ(remotes.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      SCOPED_TRACE(mem_kind_name(kKinds[k]));
      const RemoteRegion& rr = remotes[k];
      EXPECT_EQ(rr.length, kRegionLen);
      EXPECT_EQ(rr.access, static_cast<uint32_t>(kAccessAll));
      Buffer local = make_buffer(*ctx, kKinds[k], 32 * 1024, kAccessLocalWrite);
      const MemoryRegion& mr = *local.mr;
      uint64_t id = 100 * k;

      fill_pattern(local.data(), 1000, 10 + k);
      SendWr wr = send_wr(++id, mr, 0, 1000);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);

      fill_pattern(local.data(), 777, 20 + k);
      wr = send_imm_wr(++id, mr, 0, 777, 0xABC0 + static_cast<uint32_t>(k));
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);

      fill_pattern(local.data(), kWriteLen, 30 + k);
      wr = rdma_wr(Opcode::kWrite, ++id, mr, 0, kWriteLen, rr, kWriteOffset);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);

      fill_pattern(local.data(), kImmLen, 40 + k);
      wr = rdma_wr(Opcode::kWriteWithImm, ++id, mr, 0, kImmLen, rr, kImmArea);
      wr.imm = 0x5150 + static_cast<uint32_t>(k);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);

      std::memset(local.data(), 0xEE, kReadLen);
      wr = rdma_wr(Opcode::kRead, ++id, mr, 0, kReadLen, rr, kReadArea);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);
      EXPECT_TRUE(check_pattern(local.data(), kReadLen, 200 + k));

      // Successful CAS returns the old value and swaps.
      constexpr size_t kOld = 16 * 1024;  // 8-aligned spot in the local buffer
      std::memset(local.data() + kOld, 0xEE, 8);
      wr = atomic_wr(Opcode::kCompareSwap, ++id, mr, kOld, rr, kCounter, 1000 + k,
                     5000 + k);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);
      EXPECT_EQ(read_u64(local.data() + kOld), 1000u + k);

      // Failed CAS returns the current value and changes nothing.
      wr = atomic_wr(Opcode::kCompareSwap, ++id, mr, kOld, rr, kCounter, 1, 2);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);
      EXPECT_EQ(read_u64(local.data() + kOld), 5000u + k);

      wr = atomic_wr(Opcode::kFetchAdd, ++id, mr, kOld, rr, kCounter, 7);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);
      EXPECT_EQ(read_u64(local.data() + kOld), 5000u + k);

      // READ sees the atomics' result.
      wr = rdma_wr(Opcode::kRead, ++id, mr, kOld + 8, 8, rr, kCounter);
      ASSERT_TRUE(post(*ep.qp, wr));
      expect_send_done(ep, wr);
      EXPECT_EQ(read_u64(local.data() + kOld + 8), 5007u + k);

      ASSERT_TRUE(ctl->send("done"));
      ASSERT_TRUE(ctl->expect("checked"));
    }
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(20)));
  };
  run(server, client);
}

constexpr uint32_t kMaxInlineAsked = 64;

TEST_P(OpcodeTest, InlinePayloadIsCopiedAtPost) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 64 * 1024, kAccessAll);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    QpOptions options = test_qp_options();
    options.max_inline = kMaxInlineAsked;
    Endpoint ep = accept_endpoint(*ctx, *listener, options, reply);
    auto ctl = Control::accept(*ctx, *listener);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 64 * 1024, kAccessLocalWrite);
    constexpr uint32_t kSlot = 4096;
    for (uint64_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * kSlot, kSlot)));
    }
    std::string lens_text;
    ASSERT_TRUE(ctl->recv(&lens_text));
    const uint32_t max_inline = static_cast<uint32_t>(std::stoul(lens_text));
    const uint32_t lens[] = {1, max_inline / 2, max_inline};
    for (uint64_t i = 0; i < 6; ++i) {
      const uint32_t len = lens[i % 3];
      Completion c;
      ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.wr_id, i);
      EXPECT_EQ(c.byte_len, len);
      EXPECT_TRUE(check_pattern(recv.data() + i * kSlot, len, 1 + i))
          << "peer saw bytes written after post_send returned";
    }
    ASSERT_TRUE(ctl->expect("done"));
    for (uint64_t i = 0; i < 6; ++i) {
      EXPECT_TRUE(check_pattern(target.data() + i * kSlot, lens[i % 3], 11 + i))
          << "WRITE " << i;
    }
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    QpOptions options = test_qp_options();
    options.max_inline = kMaxInlineAsked;
    Endpoint ep = connect_endpoint(env, *ctx, options);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    const uint32_t max_inline = ep.qp->max_inline();
    EXPECT_GE(max_inline, kMaxInlineAsked) << "providers may only round up";
    ASSERT_GT(max_inline, 1u);
    ASSERT_TRUE(ctl->send(std::to_string(max_inline)));
    const uint32_t lens[] = {1, max_inline / 2, max_inline};

    // Even requests come from registered memory, odd ones from plain heap
    // memory with no lkey: INLINE ignores the lkey.
    Buffer registered = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    HeapBuffer plain(4096);
    auto run_op = [&](Opcode opcode, uint64_t i, uint64_t seed) {
      const uint32_t len = lens[i % 3];
      const bool use_plain = (i % 2) == 1;
      std::byte* src = use_plain ? plain.data() : registered.data();
      fill_pattern(src, len, seed);
      SendWr wr = opcode == Opcode::kSend
                      ? send_wr(seed, *registered.mr, 0, len, kSignaled | kInline)
                      : rdma_wr(Opcode::kWrite, seed, *registered.mr, 0, len, rr,
                                i * 4096, kSignaled | kInline);
      wr.local_addr = src;
      if (use_plain) wr.lkey = 0;
      ASSERT_TRUE(post(*ep.qp, wr));
      // The buffer is ours again as soon as post_send returns.
      fill_pattern(src, len, seed + 1000);
      Completion c;
      ASSERT_TRUE(wait_one(*ep.send_cq, &c));
      EXPECT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.wr_id, seed);
    };
    for (uint64_t i = 0; i < 6; ++i) run_op(Opcode::kSend, i, 1 + i);
    for (uint64_t i = 0; i < 6; ++i) run_op(Opcode::kWrite, i, 11 + i);

    // One byte over the limit is refused at post time, and nothing is posted.
    SendWr big = send_wr(99, *registered.mr, 0, max_inline + 1, kSignaled | kInline);
    const PostResult r = ep.qp->post_send(big);
    EXPECT_EQ(r.status, PostStatus::kInlineTooLarge);
    EXPECT_EQ(r.posted, 0u);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(20)));
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

constexpr uint32_t kImms[] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xDEADBEEFu, 0xFFFFFFFFu};
constexpr size_t kCount = std::size(kImms);
constexpr uint32_t kImmMsgLen = 48;

TEST_P(OpcodeTest, ImmediateValuesArriveUnchanged) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 64 * 1024, kAccessLocalWrite);
    constexpr size_t kTotal = 2 * kCount + 2;
    for (uint64_t i = 0; i < kTotal; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * 256, 256)));
    }
    std::vector<Completion> got;
    ASSERT_TRUE(wait_n(*ep.recv_cq, kTotal, &got));
    for (size_t i = 0; i < kCount; ++i) {
      // SEND_WITH_IMM i, then WRITE_WITH_IMM i.
      const Completion& s = got[2 * i];
      EXPECT_EQ(s.status, Status::kSuccess);
      EXPECT_EQ(s.opcode, Opcode::kRecv);
      EXPECT_TRUE(s.has_imm());
      EXPECT_EQ(s.imm, kImms[i]);
      EXPECT_EQ(s.byte_len, kImmMsgLen);
      EXPECT_TRUE(check_pattern(recv.data() + s.wr_id * 256, kImmMsgLen, 50 + i));
      const Completion& w = got[2 * i + 1];
      EXPECT_EQ(w.status, Status::kSuccess);
      EXPECT_EQ(w.opcode, Opcode::kRecvWriteWithImm);
      EXPECT_TRUE(w.has_imm());
      EXPECT_EQ(w.imm, kImms[i]);
      EXPECT_EQ(w.byte_len, kImmMsgLen);
      EXPECT_TRUE(check_pattern(target.data() + i * 64, kImmMsgLen, 60 + i));
    }
    // Zero-length requests still carry their immediate.
    const Completion& s0 = got[2 * kCount];
    EXPECT_EQ(s0.opcode, Opcode::kRecv);
    EXPECT_TRUE(s0.has_imm());
    EXPECT_EQ(s0.imm, 0x0BADF00Du);
    EXPECT_EQ(s0.byte_len, 0u);
    const Completion& w0 = got[2 * kCount + 1];
    EXPECT_EQ(w0.opcode, Opcode::kRecvWriteWithImm);
    EXPECT_TRUE(w0.has_imm());
    EXPECT_EQ(w0.imm, 0xFEEDFACEu);
    EXPECT_EQ(w0.byte_len, 0u);
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 64 * 1024, kAccessLocalWrite);
    std::vector<SendWr> wrs;
    for (size_t i = 0; i < kCount; ++i) {
      fill_pattern(local.data() + i * 128, kImmMsgLen, 50 + i);
      fill_pattern(local.data() + i * 128 + 64, kImmMsgLen, 60 + i);
      wrs.push_back(send_imm_wr(2 * i, *local.mr, i * 128, kImmMsgLen, kImms[i]));
      SendWr w = rdma_wr(Opcode::kWriteWithImm, 2 * i + 1, *local.mr, i * 128 + 64,
                         kImmMsgLen, rr, i * 64);
      w.imm = kImms[i];
      wrs.push_back(w);
    }
    wrs.push_back(send_imm_wr(100, *local.mr, 0, 0, 0x0BADF00D));
    SendWr w0 = rdma_wr(Opcode::kWriteWithImm, 101, *local.mr, 0, 0, rr, 0);
    w0.imm = 0xFEEDFACE;
    wrs.push_back(w0);
    // One postlist: doorbell batching must keep the order.
    const PostResult r = ep.qp->post_send(wrs);
    ASSERT_TRUE(r.ok()) << post_status_name(r.status);
    ASSERT_EQ(r.posted, wrs.size());
    std::vector<Completion> got;
    ASSERT_TRUE(wait_n(*ep.send_cq, wrs.size(), &got));
    for (size_t i = 0; i < wrs.size(); ++i) {
      EXPECT_EQ(got[i].status, Status::kSuccess);
      EXPECT_EQ(got[i].wr_id, wrs[i].wr_id);
    }
  };
  run(server, client);
}

constexpr int kFenceRounds = 10;
constexpr uint32_t kFenceLen = 4096;

TEST_P(OpcodeTest, FenceOrdersASendAfterARead) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer source = make_buffer(*ctx, MemKind::kAllocated, kFenceLen, kAccessAll);
    fill_pattern(source.data(), kFenceLen, 321);
    const auto reply = pack_regions({source.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, kFenceRounds * kFenceLen,
                              kAccessLocalWrite);
    for (uint64_t i = 0; i < kFenceRounds; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * kFenceLen, kFenceLen)));
    }
    for (uint64_t i = 0; i < kFenceRounds; ++i) {
      Completion c;
      ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
      EXPECT_EQ(c.byte_len, kFenceLen);
      EXPECT_TRUE(check_pattern(recv.data() + i * kFenceLen, kFenceLen, 321))
          << "round " << i << ": the fenced SEND did not carry the READ's data";
    }
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, kFenceRounds * kFenceLen,
                               kAccessLocalWrite);
    for (uint64_t i = 0; i < kFenceRounds; ++i) {
      // The SEND's source is the READ's sink: FENCE makes it wait for the
      // READ's data instead of sending the zeros that are there now.
      const SendWr wrs[] = {
          rdma_wr(Opcode::kRead, 2 * i, *local.mr, i * kFenceLen, kFenceLen, rr, 0),
          send_wr(2 * i + 1, *local.mr, i * kFenceLen, kFenceLen, kSignaled | kFence),
      };
      const PostResult r = ep.qp->post_send(wrs);
      ASSERT_TRUE(r.ok()) << post_status_name(r.status);
      std::vector<Completion> got;
      ASSERT_TRUE(wait_n(*ep.send_cq, 2, &got));
      EXPECT_EQ(got[0].wr_id, 2 * i);
      EXPECT_EQ(got[0].status, Status::kSuccess);
      EXPECT_EQ(got[1].wr_id, 2 * i + 1);
      EXPECT_EQ(got[1].status, Status::kSuccess);
    }
  };
  run(server, client);
}

TEST_P(OpcodeTest, PostValidationAndQueueLimits) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    ASSERT_TRUE(ctl->expect("done"));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);

    SendWr short_atomic = atomic_wr(Opcode::kFetchAdd, 1, *local.mr, 0, rr, 0, 1);
    short_atomic.length = 4;
    PostResult r = ep.qp->post_send(short_atomic);
    EXPECT_EQ(r.status, PostStatus::kInvalidArgument) << "atomic of 4 bytes";
    EXPECT_EQ(r.posted, 0u);

    SendWr receive_opcode = send_wr(2, *local.mr, 0, 8);
    receive_opcode.opcode = Opcode::kRecv;
    r = ep.qp->post_send(receive_opcode);
    EXPECT_EQ(r.status, PostStatus::kInvalidArgument) << "RECV is not a send opcode";
    EXPECT_EQ(r.posted, 0u);

    // A bad request in a postlist: the ones before it are posted and run.
    const SendWr list[] = {
        rdma_wr(Opcode::kWrite, 3, *local.mr, 0, 64, rr, 0),
        short_atomic,
        rdma_wr(Opcode::kWrite, 5, *local.mr, 0, 64, rr, 64),
    };
    r = ep.qp->post_send(list);
    EXPECT_EQ(r.status, PostStatus::kInvalidArgument);
    EXPECT_EQ(r.posted, 1u);
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 3u);
    EXPECT_EQ(c.status, Status::kSuccess);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(50)));

    // The receive queue holds max_recv_wr requests.
    const uint32_t depth = ep.qp->options().max_recv_wr;
    ASSERT_LE(depth, 4096u);
    for (uint32_t i = 0; i < depth; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(100 + i, *local.mr, 0, 64))) << i;
    }
    r = ep.qp->post_recv(recv_wr(99, *local.mr, 0, 64));
    EXPECT_EQ(r.status, PostStatus::kQueueFull);
    EXPECT_EQ(r.posted, 0u);

    // A single-owner QP refuses posts from a second thread.
    PostResult from_other_send;
    PostResult from_other_recv;
    std::thread other([&] {
      from_other_send =
          ep.qp->post_send(rdma_wr(Opcode::kWrite, 7, *local.mr, 0, 8, rr, 0));
      from_other_recv = ep.qp->post_recv(recv_wr(8, *local.mr, 0, 64));
    });
    other.join();
    EXPECT_EQ(from_other_send.status, PostStatus::kWrongThread);
    EXPECT_EQ(from_other_recv.status, PostStatus::kWrongThread);
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(20)));
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

// INLINE names where an outgoing payload comes from; READ and the atomics
// have none, so, as ibv_post_send does, every provider refuses them at post.
TEST_P(OpcodeTest, InlineWithoutOutgoingPayloadIsRefusedAtPost) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    fill_pattern(target.data(), 4096, 31);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    ASSERT_TRUE(ctl->expect("done"));
    EXPECT_TRUE(check_pattern(target.data(), 4096, 31)) << "a refused request ran";
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);

    SendWr read = rdma_wr(Opcode::kRead, 1, *local.mr, 0, 16, rr, 0);
    SendWr fetch_add = atomic_wr(Opcode::kFetchAdd, 2, *local.mr, 0, rr, 0, 1);
    SendWr compare_swap = atomic_wr(Opcode::kCompareSwap, 3, *local.mr, 0, rr, 0, 0, 1);
    for (SendWr* wr : {&read, &fetch_add, &compare_swap}) {
      wr->flags |= kInline;
      const PostResult r = ep.qp->post_send(*wr);
      EXPECT_EQ(r.status, PostStatus::kInvalidArgument)
          << "INLINE " << opcode_name(wr->opcode) << ": " << post_status_name(r.status);
      EXPECT_EQ(r.posted, 0u);
    }
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(50)));
    // The QP is unharmed: the same READ without INLINE runs.
    read.flags &= static_cast<uint8_t>(~kInline);
    ASSERT_TRUE(post(*ep.qp, read));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 1u);
    EXPECT_EQ(c.status, Status::kSuccess);
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

// An atomic whose remote address is not 8-byte aligned is refused at post,
// as rxe's ibv_post_send does, on every provider: nothing runs, the target
// is untouched and the QP stays connected.
TEST_P(OpcodeTest, MisalignedAtomicIsRefusedAtPost) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer target = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessAll);
    fill_pattern(target.data(), 4096, 55);
    const auto reply = pack_regions({target.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    ASSERT_TRUE(ctl->expect("done"));
    EXPECT_TRUE(check_pattern(target.data(), 64, 55))
        << "a refused atomic modified the target";
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const RemoteRegion rr = unpack_regions(ep.qp->peer_private_data()).at(0);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 4096, kAccessLocalWrite);
    for (const Opcode opcode : {Opcode::kFetchAdd, Opcode::kCompareSwap}) {
      for (const uint64_t offset : {uint64_t{4}, uint64_t{1}, uint64_t{12}}) {
        const SendWr wr = atomic_wr(opcode, 1, *local.mr, 0, rr, offset, 0, 1);
        const PostResult r = ep.qp->post_send(wr);
        EXPECT_EQ(r.status, PostStatus::kInvalidArgument)
            << opcode_name(opcode) << " at offset " << offset << ": "
            << post_status_name(r.status);
        EXPECT_EQ(r.posted, 0u);
      }
    }
    EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(50)));
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    // The same atomic, aligned, runs.
    ASSERT_TRUE(post(*ep.qp, atomic_wr(Opcode::kFetchAdd, 2, *local.mr, 0, rr, 64, 1)));
    Completion c;
    ASSERT_TRUE(wait_one(*ep.send_cq, &c));
    EXPECT_EQ(c.wr_id, 2u);
    EXPECT_EQ(c.status, Status::kSuccess);
    ASSERT_TRUE(ctl->send("done"));
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
