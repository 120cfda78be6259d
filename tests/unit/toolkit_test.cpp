// The core's internal toolkit (include/rdmakit/detail/): the bit-field codec
// of work request ids.
#include <gtest/gtest.h>

#include <cstdint>

#include "rdmakit/detail/bit_fields.hpp"

namespace rdmakit::detail {
namespace {

using Layout = BitFields<24, 8, 4, 7, 21>;

static_assert(Layout::kFields == 5);
static_assert(Layout::max<0>() == 0xFFFFFF && Layout::max<4>() == 0x1FFFFF);
static_assert(Layout::encode(1u, 0u, 0u, 0u, 0u) == uint64_t{1} << 40);
static_assert(Layout::encode(0u, 0u, 0u, 0u, 1u) == 1);
static_assert(BitFields<64>::max<0>() == ~uint64_t{0});

enum class Kind : uint8_t { kA = 3, kB = 9 };

TEST(BitFieldsTest, RoundTripsEveryField) {
  const uint64_t word =
      Layout::encode(0xABCDEFu, uint8_t{0x5A}, Kind::kB, 100u, 0x12345u);
  EXPECT_EQ(word, 0xABCDEF5A9C812345u);
  EXPECT_EQ(Layout::decode<0>(word), 0xABCDEFu);
  EXPECT_EQ((Layout::decode<1, uint8_t>(word)), 0x5A);
  EXPECT_EQ((Layout::decode<2, Kind>(word)), Kind::kB);
  EXPECT_EQ(Layout::decode<3>(word), 100u);
  EXPECT_EQ(Layout::decode<4>(word), 0x12345u);
}

TEST(BitFieldsTest, RunTimeValuesKeepTheirFieldsLowBits) {
  volatile uint32_t wide = 0x1FFFFFFu;  // 25 bits into a 24-bit field
  const uint64_t word = Layout::encode(wide, 0u, Kind::kA, 0u, 0u);
  EXPECT_EQ(Layout::decode<0>(word), 0xFFFFFFu);
  EXPECT_EQ((Layout::decode<2, Kind>(word)), Kind::kA);
  EXPECT_EQ(Layout::decode<1>(word), 0u);
}

}  // namespace
}  // namespace rdmakit::detail
