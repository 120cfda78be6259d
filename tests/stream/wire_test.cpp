// src/stream/wire.hpp on its own: a record placed across the ring's end
// (bytes outside the target must stay untouched; the copy itself is the
// toolkit's, tests/unit/small_copy_test.cpp) and the record size each side
// announces in its hello.
#include "stream/wire.hpp"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace rdmakit::stream::wire {
namespace {

TEST(WireCopy, RecordsSplitAtTheRingEnd) {
  constexpr uint32_t kRing = kMinRing;
  std::vector<std::byte> ring(kRing + 64,
                              std::byte{0xEE});  // 64 guard bytes past the end
  std::array<std::byte, kRecordData> rec;
  for (size_t i = 0; i < rec.size(); ++i) rec[i] = std::byte(0x10 + i);
  // 20 bytes at position 2 * kRing - 6: offset kRing - 6, so 6 at the end,
  // 14 at the start.
  place_record(ring.data(), kRing, 2 * uint64_t{kRing} - 6, rec.data(), kRecordData);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(ring[kRing - 6 + i], rec[i]) << i;
  for (size_t i = 6; i < kRecordData; ++i) EXPECT_EQ(ring[i - 6], rec[i]) << i;
  EXPECT_EQ(ring[kRecordData - 6], std::byte{0xEE});
  for (size_t i = kRing; i < ring.size(); ++i) EXPECT_EQ(ring[i], std::byte{0xEE}) << i;
  // Every length from 1 to kRecordData at every offset near the end.
  for (uint32_t len = 1; len <= kRecordData; ++len) {
    for (uint32_t back = 1; back <= kRecordData + 1; ++back) {
      std::vector<std::byte> r(kRing + 64, std::byte{0xEE});
      place_record(r.data(), kRing, kRing - back, rec.data(), len);
      for (uint32_t i = 0; i < len; ++i) {
        const uint32_t at = (kRing - back + i) % kRing;
        ASSERT_EQ(r[at], rec[i]) << "len " << len << " back " << back << " byte " << i;
      }
      for (size_t i = kRing; i < r.size(); ++i) ASSERT_EQ(r[i], std::byte{0xEE});
    }
  }
}

TEST(WireHello, RecordMaxTravelsInByte8) {
  Hello h;
  h.recv_credits = 16;
  h.ring.length = kMinRing;
  h.ring.access = kAccessRemoteWrite;
  EXPECT_EQ(h.record_max, kRecordData);  // what a stream announces
  std::array<std::byte, Hello::kSize> bytes;
  h.serialize(bytes);
  EXPECT_EQ(bytes[8], std::byte{kRecordData});
  auto back = Hello::parse(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->record_max, kRecordData);
  // A hello with 0 there (a peer that takes no records) parses: it is sent
  // ring writes only.
  bytes[8] = std::byte{0};
  back = Hello::parse(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->record_max, 0);
}

TEST(WireFlow, RecordsLargerThanOurRecordMaxAreViolations) {
  Flow f;
  f.rx_size = kMinRing;
  f.peer_credits = 16;
  EXPECT_EQ(f.on_message(encode(Op::kData, 0, kRecordData), kRecordData, true),
            Flow::Result::kOk);
  EXPECT_EQ(f.on_message(encode(Op::kData, 0, kRecordData + 1), kRecordData + 1, true),
            Flow::Result::kViolation);
  f.rx_record_max = 8;
  EXPECT_EQ(f.on_message(encode(Op::kData, 0, 8), 8, true), Flow::Result::kOk);
  EXPECT_EQ(f.on_message(encode(Op::kData, 0, 9), 9, true), Flow::Result::kViolation);
  // Ring writes are not records: the limit does not apply.
  EXPECT_EQ(f.on_message(encode(Op::kData, 0, 100), 100, false), Flow::Result::kOk);
  EXPECT_EQ(f.rx_written, uint64_t{kRecordData} + 8 + 100);
}

}  // namespace
}  // namespace rdmakit::stream::wire
