// The verbs provider's RLIMIT_MEMLOCK pre-check counts pages as the kernel
// pins them: a page-aligned region costs exactly its size (the check added a
// page and refused a 64 KiB region under a 64 KiB limit), an unaligned one the
// pages it touches, and a range that wraps the address space is refused.
#include <gtest/gtest.h>

#include <cstdint>

#include "providers/verbs/verbs_device.hpp"

namespace rdmakit::verbs {
namespace {

TEST(VerbsMemlockTest, PinnedPagesAreThePagesTheRangeTouches) {
  constexpr uint64_t kPage = 4096;
  EXPECT_EQ(pinned_pages(0x10000, 0, kPage), 0u);
  EXPECT_EQ(pinned_pages(0x10000, 1, kPage), 1u);
  EXPECT_EQ(pinned_pages(0x10000, kPage, kPage), 1u);
  EXPECT_EQ(pinned_pages(0x10000, 16 * kPage, kPage), 16u);    // 64 KiB: 16 pages, not 17
  EXPECT_EQ(pinned_pages(0x10000 + kPage - 1, 2, kPage), 2u);  // straddles a boundary
  EXPECT_EQ(pinned_pages(0x10000 + 8, kPage, kPage), 2u);
  EXPECT_EQ(pinned_pages(UINT64_MAX - 10, 100, kPage), UINT64_MAX);  // wraps
  EXPECT_EQ(pinned_pages(UINT64_MAX - kPage + 1, kPage, kPage), 1u);
}

}  // namespace
}  // namespace rdmakit::verbs
