// The core's internal toolkit (include/rdmakit/detail/): the bit-field codec
// of work request ids, the conditional lock.
#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <thread>

#include "rdmakit/detail/bit_fields.hpp"
#include "rdmakit/detail/conditional_lock.hpp"

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

struct CountingMutex {
  void lock() { ++locks; }
  void unlock() { ++unlocks; }
  int locks = 0;
  int unlocks = 0;
};

TEST(ConditionalLockTest, TakesTheMutexOnlyWhenAsked) {
  CountingMutex mu;
  {
    ConditionalLock lock(mu, true);
    EXPECT_TRUE(lock.owns_lock());
    EXPECT_EQ(mu.locks, 1);
    lock.unlock();
    EXPECT_FALSE(lock.owns_lock());
    EXPECT_EQ(mu.unlocks, 1);
  }
  EXPECT_EQ(mu.unlocks, 1);  // released once
  { const ConditionalLock lock(mu, true); }
  EXPECT_EQ(mu.unlocks, 2);  // released on scope exit
  {
    const ConditionalLock lock(mu, false);
    EXPECT_FALSE(lock.owns_lock());
  }
  EXPECT_EQ(mu.locks, 2);
  EXPECT_EQ(mu.unlocks, 2);
}

// Whether another thread could take it now.
bool free_elsewhere(ConditionalMutex& mu) {
  bool taken = false;
  std::thread([&] {
    taken = mu.try_lock();
    if (taken) mu.unlock();
  }).join();
  return taken;
}

TEST(ConditionalMutexTest, LocksOnlyWhenShared) {
  ConditionalMutex shared;
  EXPECT_TRUE(shared.shared());
  {
    const std::lock_guard lock(shared);
    EXPECT_FALSE(free_elsewhere(shared));
  }
  EXPECT_TRUE(free_elsewhere(shared));
  ConditionalMutex owned;
  owned.set_shared(false);
  const std::lock_guard lock(owned);
  EXPECT_TRUE(free_elsewhere(owned));
}

}  // namespace
}  // namespace rdmakit::detail
