// The toolkit's copies of a few bytes (rdmakit/detail/small_copy.hpp, used
// by the shm provider and the streams): small_copy and copy_bytes must equal
// memcpy for every length, at any alignment, and write nothing outside the
// destination.
#include "rdmakit/detail/small_copy.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

namespace rdmakit::detail {
namespace {

TEST(SmallCopyTest, EqualsMemcpyForEveryLengthAndAlignment) {
  std::array<std::byte, 96> src;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  for (size_t n = 0; n <= kSmallCopyMax; ++n) {
    for (size_t src_off = 0; src_off < 8; ++src_off) {
      for (size_t dst_off = 0; dst_off < 8; ++dst_off) {
        std::array<std::byte, 96> got;
        std::array<std::byte, 96> want;
        got.fill(std::byte{0xEE});
        want.fill(std::byte{0xEE});
        small_copy(got.data() + dst_off, src.data() + src_off, n);
        std::memcpy(want.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(got, want) << "n=" << n << " src+" << src_off << " dst+" << dst_off;
      }
    }
  }
}

// The bounded form copies into a receive slot's 20 inline bytes.
TEST(SmallCopyTest, BoundedFormEqualsMemcpyUpToItsBound) {
  constexpr size_t kMax = 20;
  std::array<std::byte, 64> src;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 5 + 3);
  for (size_t n = 0; n <= kMax; ++n) {
    for (size_t off = 0; off < 8; ++off) {
      std::array<std::byte, 64> got;
      std::array<std::byte, 64> want;
      got.fill(std::byte{0xEE});
      want.fill(std::byte{0xEE});
      small_copy<kMax>(got.data() + off, src.data(), n);
      std::memcpy(want.data() + off, src.data(), n);
      ASSERT_EQ(got, want) << "n=" << n << " dst+" << off;
    }
  }
}

// The streams copy ring pieces of any length with it.
TEST(SmallCopyTest, CopyBytesEqualsMemcpyAroundItsThreshold) {
  std::array<std::byte, 160> src;
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  for (size_t n = 0; n <= 2 * kSmallCopyMax; ++n) {
    for (size_t src_off = 0; src_off < 8; ++src_off) {
      for (size_t dst_off = 0; dst_off < 8; ++dst_off) {
        std::array<std::byte, 160> got;
        std::array<std::byte, 160> want;
        got.fill(std::byte{0xEE});
        want.fill(std::byte{0xEE});
        copy_bytes(got.data() + 16 + dst_off, src.data() + src_off, n);
        std::memcpy(want.data() + 16 + dst_off, src.data() + src_off, n);
        ASSERT_EQ(got, want) << "n=" << n << " src+" << src_off << " dst+" << dst_off;
      }
    }
  }
}

TEST(SmallCopyTest, CopyBytesHandlesLargeLengths) {
  std::array<std::byte, 300> src;
  std::array<std::byte, 300> dst{};
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
  copy_bytes(dst.data(), src.data(), src.size());
  EXPECT_EQ(dst, src);
}

}  // namespace
}  // namespace rdmakit::detail
