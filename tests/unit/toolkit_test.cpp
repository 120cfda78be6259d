// The core's internal toolkit (include/rdmakit/detail/): the bit-field codec
// of work request ids, the conditional lock, the hellos' framing, byte counts
// as text, library threads' signal masks.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <span>
#include <thread>

#include "rdmakit/detail/bit_fields.hpp"
#include "rdmakit/detail/conditional_lock.hpp"
#include "rdmakit/detail/format_bytes.hpp"
#include "rdmakit/detail/hello_frame.hpp"
#include "rdmakit/detail/library_thread.hpp"

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

template <size_t N>
std::array<std::byte, N> bytes(std::initializer_list<int> values) {
  std::array<std::byte, N> out{};
  size_t i = 0;
  for (const int v : values) out[i++] = static_cast<std::byte>(v);
  return out;
}

TEST(HelloFrameTest, WritesMagicThenVersionLittleEndian) {
  constexpr HelloFrame<uint16_t> frame{0x43544b52, 1, 8, HelloSize::kAtLeast};
  std::array<std::byte, 8> out{};
  frame.put(out.data());
  EXPECT_EQ(out, (bytes<8>({0x52, 0x4b, 0x54, 0x43, 0x01, 0x00})));
  constexpr HelloFrame<uint8_t> small{0x314b5352, 2, 5, HelloSize::kAtLeast};
  std::array<std::byte, 5> one{};
  small.put(one.data());
  EXPECT_EQ(one, (bytes<5>({0x52, 0x53, 0x4b, 0x31, 0x02})));
  constexpr HelloFrame<uint32_t, std::endian::big> big{0x01020304, 5, 8,
                                                       HelloSize::kExactly};
  big.put(out.data());
  EXPECT_EQ(out, (bytes<8>({1, 2, 3, 4, 0, 0, 0, 5})));
  EXPECT_TRUE(big.check(out));
}

TEST(HelloFrameTest, ChecksMagicThenVersionThenSize) {
  constexpr HelloFrame<uint16_t> exact{0x53534b52, 2, 8, HelloSize::kExactly};
  std::array<std::byte, 9> in{};
  exact.put(in.data());
  const std::span<const std::byte> all(in);
  EXPECT_TRUE(exact.check(all.first(8)));
  EXPECT_EQ(exact.check(all.first(8)).version, 2);
  EXPECT_EQ(exact.check(all).fault, HelloFault::kSize);
  EXPECT_EQ(exact.check(all.first(7)).fault, HelloFault::kSize);
  EXPECT_STREQ(exact.check(all.first(7)).why(), "wrong size");
  EXPECT_EQ(exact.check(all.first(3)).fault, HelloFault::kMagic);
  EXPECT_EQ(exact.check(all.first(5)).fault, HelloFault::kVersion);
  EXPECT_EQ(exact.check(all.first(5)).version, 0);
  in[4] = std::byte{3};
  EXPECT_EQ(exact.check(all.first(8)).fault, HelloFault::kVersion);
  EXPECT_EQ(exact.check(all.first(8)).version, 3);
  in[0] = std::byte{0};
  EXPECT_EQ(exact.check(all.first(8)).fault, HelloFault::kMagic);
  EXPECT_STREQ(exact.check(all.first(8)).why(), "bad magic");
  constexpr HelloFrame<uint16_t> at_least{0x53534b52, 2, 6, HelloSize::kAtLeast};
  at_least.put(in.data());
  EXPECT_TRUE(at_least.check(all));
}

TEST(FormatBytesTest, LargestUnitThatDividesExactly) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1 KiB");
  EXPECT_EQ(format_bytes(1536), "1536 B");
  EXPECT_EQ(format_bytes(3u << 20), "3 MiB");
  EXPECT_EQ(format_bytes((1ull << 30) + (1ull << 20)), "1025 MiB");
  EXPECT_EQ(format_bytes(8ull << 30), "8 GiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "unlimited");
}

TEST(LibraryThreadTest, StartsWithAsynchronousSignalsBlockedAndRestoresTheCaller) {
  sigset_t before;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &before), 0);
  sigset_t inside;
  start_library_thread([&] { pthread_sigmask(SIG_SETMASK, nullptr, &inside); }).join();
  for (const int sig : {SIGALRM, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD, SIGPIPE})
    EXPECT_EQ(sigismember(&inside, sig), 1) << sig;
  for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS})
    EXPECT_EQ(sigismember(&inside, sig), 0) << sig;
  sigset_t after;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &after), 0);
  for (int sig = 1; sig < NSIG; ++sig)
    EXPECT_EQ(sigismember(&after, sig), sigismember(&before, sig)) << sig;
}

}  // namespace
}  // namespace rdmakit::detail
