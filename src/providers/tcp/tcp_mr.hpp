#pragma once
// The tcp provider's memory regions: the region table, registered regions
// looked up by key at every remote access without a lock, and TcpMr, the
// application's handle of one entry.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "rdmakit/memory.hpp"

namespace rdmakit::tcp {

// One registered region. Slots are never freed while the context lives, so a
// stale pointer is always safe to read; `rkey == 0` means free/deregistered.
struct MrEntry {
  std::atomic<uint32_t> rkey{0};
  std::atomic<uint32_t> lkey{0};
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  // Remote accesses in progress. Deregistration waits for zero (cutting the
  // QPs that hold it too long), so no byte lands in a region after its
  // MemoryRegion is destroyed.
  std::atomic<uint32_t> users{0};
};

// Lock-free lookup of rkeys/lkeys. A key is a secret, per-context
// permutation of (random tag << 16 | slot): all 32 bits look random to a
// peer, so a blind guess names a live region with probability
// live/2^32 and a known key says nothing about the keys of other slots,
// yet the slot comes back with one inverse permutation (no search).
class MrTable {
 public:
  static constexpr uint32_t kSlots = 1u << 16;
  MrTable();
  // Throws Error(ENOSPC) when every slot is in use.
  MrEntry* add(uint64_t addr, uint64_t length, uint32_t access);
  // Makes later lookups fail; in-flight accesses keep their pins.
  static void revoke(MrEntry* entry) noexcept;
  // Returns the slot for reuse; the caller saw users == 0 after revoke().
  void free_slot(MrEntry* entry) noexcept;
  // Pins the region for a remote access of [addr, addr+len) needing `need`.
  // Returns nullptr (and nothing is pinned) on any violation.
  MrEntry* acquire(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t need) noexcept;
  static void release(MrEntry* entry) noexcept {
    if (entry != nullptr) entry->users.fetch_sub(1, std::memory_order_release);
  }
  // Local key check at post time (no pin: the caller owns that memory).
  bool check_local(uint32_t lkey, const void* addr, uint64_t len,
                   uint32_t need) const noexcept;
  // Deterministic keys for the fuzzer's seed corpus; never used otherwise.
  void reseed_for_testing(uint32_t seed) {
    test_rng_.seed(seed);
    deterministic_ = true;
    new_secret();
  }
  // The slot a key names (inverse permutation); tests use it.
  uint32_t slot_of(uint32_t key) const noexcept { return unmix(key) & (kSlots - 1); }

 private:
  static constexpr int kRounds = 4;
  void new_secret();
  uint64_t random64();
  uint32_t make_key(uint32_t slot);
  uint32_t mix(uint32_t plain) const noexcept;
  uint32_t unmix(uint32_t key) const noexcept;
  uint32_t round_fn(int round, uint32_t half) const noexcept;
  uint64_t secret_[kRounds] = {};
  std::unique_ptr<MrEntry[]> slots_;
  std::mutex mu_;  // control path only: add/remove
  std::vector<uint32_t> free_;
  uint32_t next_ = 1;          // slot 0 is never used
  std::random_device random_;  // getrandom(): keys must not be predictable
  std::mt19937_64 test_rng_;
  bool deterministic_ = false;
};

class TcpProgress;

// A registered region: its entry in the context's table, revoked (and, for
// allocate()d memory, unmapped) on destruction.
class TcpMr final : public MemoryRegion {
 public:
  TcpMr(std::shared_ptr<TcpProgress> progress, MrEntry* entry, void* addr, size_t length,
        uint32_t access, bool mapped)
      : MemoryRegion(addr, length, entry->lkey.load(), entry->rkey.load(), access,
                     ProviderKind::kTcp),
        progress_(std::move(progress)),
        entry_(entry),
        mapped_(mapped) {}
  ~TcpMr() override;

 private:
  std::shared_ptr<TcpProgress> progress_;
  MrEntry* entry_;
  bool mapped_;
};

}  // namespace rdmakit::tcp
