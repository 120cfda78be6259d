// Writers PUT and DELETE values that carry their own checksum while readers
// READ-GET the same keys, on every provider under test: zero torn values, zero
// values older than the last PUT the reader had seen complete, and no deleted
// key returned as if current. One million READ-GETs on shm in release
// (KV_TORN_READS_*; RDMAKIT_KV_TORN_READS overrides).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "kv_test_util.hpp"
#include "table.hpp"
#include "table_layout.hpp"

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

// The reader's checks against a copy that races the writer for sure: a
// thread copies a neighborhood of the table byte by byte, last byte first (an
// order a DMA engine may use and the server's memcpy does not), while another
// PUTs and DELETEs keys of that bucket, so many copies mix states of a slot.
// Every answer must be a whole value, and some copies must have been
// rejected: with the checks removed, this fails within milliseconds (the
// two-process test above rarely sees a torn copy: a provider's READ of a
// few hundred bytes is hard to catch mid-way).
TEST(KvTornCopy, ByteByByteCopiesRacingTheWriterAreWholeOrRejected) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs to race";
  ContextOptions co;
  co.provider = ProviderKind::kShm;
  auto ctx = Context::open(co);
  Table table(*ctx, {.capacity = 8, .grow = false});  // 16 buckets
  const TableInfo info = table.info();
  std::vector<std::string> keys;  // one home bucket, so hits lie past the home slot
  const uint64_t home = info.home_bucket(key_hash("0"));
  for (int i = 0; keys.size() < 4; ++i) {
    std::string k = std::to_string(i);
    if (info.home_bucket(key_hash(k)) == home) keys.push_back(k);
  }
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t n = 1; !stop.load(std::memory_order_relaxed); ++n) {
      const uint64_t k = n % keys.size();
      if (n % 7 == 0) {
        table.erase(keys[k]);
      } else {
        ASSERT_EQ(table.put(keys[k], checked_value(k, n, n % 23)), PutOutcome::kOk);
      }
    }
  });
  const auto* src = reinterpret_cast<const volatile unsigned char*>(info.region.addr) +
                    info.slot_offset(home);
  std::vector<std::byte> copy(kNeighborhood * kSlotSize);
  uint64_t copies = 0, found = 0, rejected = 0, torn = 0;
  std::string value;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(3) &&
         (copies < 20000 || rejected < 200)) {
    for (size_t i = copy.size(); i-- > 0;) copy[i] = std::byte(src[i]);
    ++copies;
    const uint64_t k = copies % keys.size();
    const ProbeResult p = probe_neighborhood(copy, keys[k], &value);
    if (p.probe == Probe::kRetry) {
      ++rejected;
    } else if (p.probe == Probe::kFound) {
      ++found;
      uint64_t got_key = 0, n = 0;
      if (!parse_checked(value, &got_key, &n) || got_key != k) ++torn;
    } else {
      EXPECT_EQ(p.probe, Probe::kAbsent);
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(torn, 0u) << "of " << found << " values found in " << copies << " copies";
  EXPECT_GT(found, 0u);
  EXPECT_GT(rejected, 0u) << "no copy raced the writer in " << copies << " copies";
}

}  // namespace
}  // namespace rdmakit::kv::test
