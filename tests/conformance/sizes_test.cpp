// SEND, WRITE and READ at boundary sizes, into allocate()d and registered
// heap memory, checked byte for byte including the bytes around each target.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class SizeTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SizeTest);

constexpr std::array<uint32_t, 8> kSizes = {0, 1, 63, 64, 4095, 4096, 65536, 8u << 20};
constexpr size_t kGuard = 64;  // untouched bytes after every slot
constexpr MemKind kKinds[] = {MemKind::kAllocated, MemKind::kHeap};

// Offsets of the slots in a region holding one slot per size.
constexpr std::array<size_t, kSizes.size() + 1> slot_offsets() {
  std::array<size_t, kSizes.size() + 1> out{};
  for (size_t i = 0; i < kSizes.size(); ++i) {
    out[i + 1] = out[i] + (kSizes[i] + kGuard + 63) / 64 * 64;
  }
  return out;
}
constexpr auto kOffsets = slot_offsets();
constexpr size_t kRegionLen = kOffsets.back();

uint64_t seed(int base, size_t kind, size_t i) { return base + 10 * kind + i; }

TEST_P(SizeTest, SendWriteReadAtBoundarySizes) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    std::vector<Buffer> writes, reads, recvs;
    std::vector<RemoteRegion> remotes;
    for (size_t k = 0; k < 2; ++k) {
      writes.push_back(make_buffer(*ctx, kKinds[k], kRegionLen, kAccessAll));
      reads.push_back(make_buffer(*ctx, kKinds[k], kRegionLen, kAccessAll));
      recvs.push_back(make_buffer(*ctx, kKinds[k], kRegionLen, kAccessLocalWrite));
      for (size_t i = 0; i < kSizes.size(); ++i) {
        fill_pattern(reads[k].data() + kOffsets[i], kSizes[i], seed(500, k, i));
      }
      remotes.push_back(writes[k].mr->remote());
      remotes.push_back(reads[k].mr->remote());
    }
    const auto reply = pack_regions(remotes);
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    // RECVs sized exactly like the SENDs: an exact fit is not an overflow.
    for (size_t k = 0; k < 2; ++k) {
      for (size_t i = 0; i < kSizes.size(); ++i) {
        ASSERT_TRUE(
            post(*ep.qp, recv_wr(k * 100 + i, *recvs[k].mr, kOffsets[i], kSizes[i])));
      }
    }
    for (size_t k = 0; k < 2; ++k) {
      SCOPED_TRACE(mem_kind_name(kKinds[k]));
      for (size_t i = 0; i < kSizes.size(); ++i) {
        SCOPED_TRACE("SEND of " + std::to_string(kSizes[i]) + " bytes");
        Completion c;
        ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
        ASSERT_EQ(c.status, Status::kSuccess);
        EXPECT_EQ(c.wr_id, k * 100 + i);
        EXPECT_EQ(c.opcode, Opcode::kRecv);
        EXPECT_EQ(c.byte_len, kSizes[i]);
        EXPECT_TRUE(
            check_pattern(recvs[k].data() + kOffsets[i], kSizes[i], seed(300, k, i)));
      }
      ASSERT_TRUE(ctl->expect("written"));
      for (size_t i = 0; i < kSizes.size(); ++i) {
        SCOPED_TRACE("WRITE of " + std::to_string(kSizes[i]) + " bytes");
        const std::byte* slot = writes[k].data() + kOffsets[i];
        EXPECT_TRUE(check_pattern(slot, kSizes[i], seed(400, k, i)));
        EXPECT_TRUE(
            check_filled(slot + kSizes[i], kOffsets[i + 1] - kOffsets[i] - kSizes[i], 0))
            << "bytes after the target were written";
      }
      ASSERT_TRUE(ctl->send("checked"));
    }
    ASSERT_TRUE(ctl->expect("read"));
    for (size_t k = 0; k < 2; ++k) {
      for (size_t i = 0; i < kSizes.size(); ++i) {
        EXPECT_TRUE(
            check_pattern(reads[k].data() + kOffsets[i], kSizes[i], seed(500, k, i)))
            << "READ source modified";
      }
    }
  };

  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    const auto remotes = unpack_regions(ep.qp->peer_private_data());
    ASSERT_EQ(remotes.size(), 4u);
    uint64_t id = 0;
    auto run_one = [&](const SendWr& wr) {
      ASSERT_TRUE(post(*ep.qp, wr));
      Completion c;
      ASSERT_TRUE(wait_one(*ep.send_cq, &c));
      EXPECT_EQ(c.status, Status::kSuccess)
          << opcode_name(wr.opcode) << " of " << wr.length << " bytes";
      EXPECT_EQ(c.wr_id, wr.wr_id);
    };
    for (size_t k = 0; k < 2; ++k) {
      SCOPED_TRACE(mem_kind_name(kKinds[k]));
      const RemoteRegion& write_rr = remotes[2 * k];
      const RemoteRegion& read_rr = remotes[2 * k + 1];
      Buffer local = make_buffer(*ctx, kKinds[k], kRegionLen, kAccessLocalWrite);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        fill_pattern(local.data() + kOffsets[i], kSizes[i], seed(300, k, i));
        run_one(send_wr(++id, *local.mr, kOffsets[i], kSizes[i]));
      }
      for (size_t i = 0; i < kSizes.size(); ++i) {
        fill_pattern(local.data() + kOffsets[i], kSizes[i], seed(400, k, i));
        run_one(rdma_wr(Opcode::kWrite, ++id, *local.mr, kOffsets[i], kSizes[i], write_rr,
                        kOffsets[i]));
      }
      ASSERT_TRUE(ctl->send("written"));
      ASSERT_TRUE(ctl->expect("checked"));
      std::memset(local.data(), 0xEE, kRegionLen);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        SCOPED_TRACE("READ of " + std::to_string(kSizes[i]) + " bytes");
        run_one(rdma_wr(Opcode::kRead, ++id, *local.mr, kOffsets[i], kSizes[i], read_rr,
                        kOffsets[i]));
        EXPECT_TRUE(
            check_pattern(local.data() + kOffsets[i], kSizes[i], seed(500, k, i)));
        const size_t guard = kOffsets[i + 1] - kOffsets[i] - kSizes[i];
        EXPECT_TRUE(check_filled(local.data() + kOffsets[i] + kSizes[i], guard, 0xEE))
            << "READ wrote past its length";
      }
    }
    ASSERT_TRUE(ctl->send("read"));
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
