// RemoteRegion wire format: round trip and rejection of malformed blobs.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "rdmakit/memory.hpp"

namespace rdmakit {
namespace {

RemoteRegion sample() {
  RemoteRegion r;
  r.addr = 0x00007F12'3456'7000ull;
  r.length = 8ull << 30;  // beyond 32 bits: both halves must survive
  r.rkey = 0xDEADBEEF;
  r.access = kAccessRemoteWrite | kAccessRemoteRead;
  r.provider = ProviderKind::kVerbs;
  return r;
}

TEST(RemoteRegionTest, RoundTripVector) {
  const RemoteRegion in = sample();
  const std::vector<std::byte> blob = in.serialize();
  ASSERT_EQ(blob.size(), RemoteRegion::kSerializedSize);
  const auto out = RemoteRegion::deserialize(blob);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(*out, in);
}

TEST(RemoteRegionTest, RoundTripFixedSpanEveryProviderAndAccess) {
  for (auto provider : {ProviderKind::kAuto, ProviderKind::kShm, ProviderKind::kTcp,
                        ProviderKind::kVerbs}) {
    for (uint32_t access = 0; access <= kAccessAll; ++access) {
      RemoteRegion in = sample();
      in.provider = provider;
      in.access = access;
      std::array<std::byte, RemoteRegion::kSerializedSize> blob{};
      in.serialize(blob);
      const auto out = RemoteRegion::deserialize(blob);
      ASSERT_TRUE(out.has_value()) << "access " << access;
      EXPECT_EQ(*out, in);
    }
  }
}

TEST(RemoteRegionTest, LayoutIsLittleEndianWithMagicAndVersion) {
  const std::vector<std::byte> blob = sample().serialize();
  EXPECT_EQ(blob[0], std::byte{'R'});
  EXPECT_EQ(blob[1], std::byte{'K'});
  EXPECT_EQ(blob[2], std::byte{RemoteRegion::kVersion});
  EXPECT_EQ(blob[3], std::byte{3});     // kVerbs
  EXPECT_EQ(blob[4], std::byte{0xEF});  // rkey, low byte first
  EXPECT_EQ(blob[7], std::byte{0xDE});
  EXPECT_EQ(blob[8], std::byte{0x00});  // addr, low byte first
  EXPECT_EQ(blob[9], std::byte{0x70});
}

TEST(RemoteRegionTest, LongerBlobUsesThePrefix) {
  std::vector<std::byte> blob = sample().serialize();
  blob.resize(blob.size() + 7, std::byte{0xAA});
  const auto out = RemoteRegion::deserialize(blob);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(*out, sample());
}

TEST(RemoteRegionTest, RejectsShortBlob) {
  const std::vector<std::byte> blob = sample().serialize();
  for (size_t n = 0; n < blob.size(); ++n) {
    EXPECT_FALSE(RemoteRegion::deserialize(std::span(blob.data(), n))) << "length " << n;
  }
}

TEST(RemoteRegionTest, RejectsBadMagic) {
  for (size_t at : {0u, 1u}) {
    std::vector<std::byte> blob = sample().serialize();
    blob[at] ^= std::byte{0x20};
    EXPECT_FALSE(RemoteRegion::deserialize(blob)) << "byte " << at;
  }
}

TEST(RemoteRegionTest, RejectsBadVersion) {
  for (int version : {0, RemoteRegion::kVersion + 1, 255}) {
    std::vector<std::byte> blob = sample().serialize();
    blob[2] = static_cast<std::byte>(version);
    EXPECT_FALSE(RemoteRegion::deserialize(blob)) << "version " << version;
  }
}

TEST(RemoteRegionTest, RejectsUnknownProvider) {
  std::vector<std::byte> blob = sample().serialize();
  blob[3] = std::byte{4};
  EXPECT_FALSE(RemoteRegion::deserialize(blob));
}

TEST(RemoteRegionTest, RejectsBadAccessBits) {
  for (uint32_t bad : {1u << 4, 1u << 31, 0xFFFFFFFFu}) {
    RemoteRegion in = sample();
    in.access = bad;
    const std::vector<std::byte> blob = in.serialize();
    EXPECT_FALSE(RemoteRegion::deserialize(blob)) << "access " << bad;
  }
}

TEST(RemoteRegionTest, AddrAtOffsets) {
  const RemoteRegion r = sample();
  EXPECT_EQ(r.addr_at(0), r.addr);
  EXPECT_EQ(r.addr_at(4096), r.addr + 4096);
}

}  // namespace
}  // namespace rdmakit
