// Writers PUT and DELETE values that carry their own checksum while readers
// READ-GET the same keys, on every provider under test: zero torn values, zero
// values older than the last PUT the reader had seen complete, and no deleted
// key returned as if current. One million READ-GETs on shm in release
// (KV_TORN_READS_*; RDMAKIT_KV_TORN_READS overrides).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "kv_test_util.hpp"

namespace rdmakit::kv::test {
namespace {

using rdmakit::test::RoleEnv;
using rdmakit::test::run_roles;

constexpr int kWriters = 2;
constexpr int kReaders = 2;
constexpr uint64_t kKeys = 24;

uint64_t reads_for(const std::string& provider) {
  if (const char* env = std::getenv("RDMAKIT_KV_TORN_READS"))
    return std::strtoull(env, nullptr, 10);
  if (provider == "shm") return KV_TORN_READS_SHM;
  if (provider == "tcp") return KV_TORN_READS_TCP;
  return 20000;  // verbs, in an emulated Soft-RoCE VM
}

// Per key: the last operation a writer saw complete (n << 1 | is_delete) and
// the n of the last DELETE it started.
struct KeyState {
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> delete_started{0};
};

class KvTornReadTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Providers, KvTornReadTest, ::testing::ValuesIn(kv_providers()));

TEST_P(KvTornReadTest, ReadGetsRacingPutsAndDeletesAreNeverTornOrStale) {
  const uint64_t total_reads = reads_for(GetParam());
  run_roles(
      // 16 buckets for 24 keys: crowded neighborhoods, so READ-GETs also
      // take the second READ of a home slot's reach while it grows.
      GetParam(), [](RoleEnv& env) { serve(env, kWriters + kReaders, {.capacity = 8}); },
      [total_reads](RoleEnv& env) {
        KeyState keys[kKeys];
        std::atomic<int> readers_left{kReaders};
        std::atomic<int> writers_started{0};  // each wrote its keys once
        std::atomic<uint64_t> torn{0}, stale{0}, stale_deleted{0}, found{0}, absent{0};
        std::atomic<uint64_t> puts{0}, deletes{0}, retries{0}, wide{0};
        std::atomic<bool> failed{false};
        std::vector<std::thread> threads;
        const ClientOptions co = client_options(env);
        for (int w = 0; w < kWriters; ++w) {
          threads.emplace_back([&, w] {
            try {
              Client c(co);
              std::mt19937_64 rng(w + 1);
              for (uint64_t n = 1; readers_left.load() > 0 && !failed; ++n) {
                for (uint64_t k = w; k < kKeys; k += kWriters) {
                  const bool del = rng() % 8 == 0;
                  if (del) {
                    keys[k].delete_started.store(n, std::memory_order_release);
                    const KvStatus s = c.del(std::to_string(k));
                    ASSERT_TRUE(s == KvStatus::kOk || s == KvStatus::kNotFound);
                    deletes.fetch_add(1, std::memory_order_relaxed);
                  } else {
                    // 0..600 B of filler, sometimes 8 KiB: inline and block entries.
                    const size_t filler = rng() % 16 == 0 ? 8192 : rng() % 600;
                    ASSERT_EQ(c.put(std::to_string(k), checked_value(k, n, filler)),
                              KvStatus::kOk);
                    puts.fetch_add(1, std::memory_order_relaxed);
                  }
                  keys[k].done.store(n << 1 | (del ? 1 : 0), std::memory_order_release);
                }
                if (n == 1) writers_started.fetch_add(1);
              }
            } catch (const std::exception& e) {
              failed = true;
              ADD_FAILURE() << "writer " << w << ": " << e.what();
            }
          });
        }
        for (int r = 0; r < kReaders; ++r) {
          threads.emplace_back([&, r] {
            try {
              Client c(co);
              std::mt19937_64 rng(100 + r);
              while (writers_started.load() < kWriters && !failed)
                std::this_thread::yield();
              std::string value;
              const uint64_t mine = total_reads / kReaders;
              for (uint64_t i = 0; i < mine && !failed; ++i) {
                const uint64_t k = rng() % kKeys;
                const uint64_t before = keys[k].done.load(std::memory_order_acquire);
                const uint64_t floor = before >> 1;
                const bool floor_deleted = (before & 1) != 0;
                const KvStatus s = c.get(std::to_string(k), &value, GetMode::kRead);
                if (s == KvStatus::kNotFound) {
                  absent.fetch_add(1, std::memory_order_relaxed);
                  // Absent is right if the last completed op was a delete (or
                  // none), or a delete started since.
                  const bool ok =
                      before == 0 || floor_deleted ||
                      keys[k].delete_started.load(std::memory_order_acquire) > floor;
                  if (!ok) stale_deleted.fetch_add(1);
                  continue;
                }
                ASSERT_EQ(s, KvStatus::kOk);
                found.fetch_add(1, std::memory_order_relaxed);
                uint64_t key = 0;
                uint64_t n = 0;
                if (!parse_checked(value, &key, &n) || key != k) {
                  torn.fetch_add(1);
                  continue;
                }
                // Older than the last PUT seen complete, or a value the last
                // completed DELETE removed, is stale.
                if (n < floor || (floor_deleted && n <= floor)) stale.fetch_add(1);
              }
              retries.fetch_add(c.read_stats().retries);
              wide.fetch_add(c.read_stats().wide);
            } catch (const std::exception& e) {
              failed = true;
              ADD_FAILURE() << "reader " << r << ": " << e.what();
            }
            readers_left.fetch_sub(1);
          });
        }
        for (auto& t : threads) t.join();
        std::printf(
            "[ kv      ] %s: %lu READ-GETs (%lu found, %lu absent), %lu PUTs, %lu "
            "DELETEs, "
            "%lu snapshots retried, %lu GETs read past 4 slots\n",
            env.provider().c_str(), static_cast<unsigned long>(found + absent),
            static_cast<unsigned long>(found.load()),
            static_cast<unsigned long>(absent.load()),
            static_cast<unsigned long>(puts.load()),
            static_cast<unsigned long>(deletes.load()),
            static_cast<unsigned long>(retries.load()),
            static_cast<unsigned long>(wide.load()));
        EXPECT_EQ(torn.load(), 0u);
        EXPECT_EQ(stale.load(), 0u);
        EXPECT_EQ(stale_deleted.load(), 0u);
        EXPECT_EQ(found + absent, total_reads / kReaders * kReaders);
        // Most GETs find their key (writers delete one op in eight): a run of
        // absent answers only would check nothing.
        EXPECT_GT(found.load(), (found + absent) / 2);
        EXPECT_GT(puts.load(), 0u);
        EXPECT_GT(deletes.load(), 0u);
        EXPECT_GT(wide.load(), 0u);
      },
      {.timeout = std::chrono::seconds(200)});
}

}  // namespace
}  // namespace rdmakit::kv::test
