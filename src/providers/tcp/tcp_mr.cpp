#include "providers/tcp/tcp_mr.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "providers/tcp/tcp_progress.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

MrTable::MrTable() : slots_(new MrEntry[kSlots]) { new_secret(); }

uint64_t MrTable::random64() {
  if (deterministic_) return test_rng_();
  return (uint64_t{random_()} << 32) | random_();
}

void MrTable::new_secret() {
  for (uint64_t& k : secret_) k = random64();
}

// Feistel round function: a keyed splitmix64 finalizer, 16 bits out. Four
// rounds over the two 16-bit halves give a keyed permutation of 32 bits.
uint32_t MrTable::round_fn(int round, uint32_t half) const noexcept {
  uint64_t z = secret_[round] + half * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 48);
}

uint32_t MrTable::mix(uint32_t plain) const noexcept {
  uint32_t l = plain >> 16, r = plain & 0xffff;
  for (int i = 0; i < kRounds; ++i) {
    const uint32_t next = l ^ round_fn(i, r);
    l = r;
    r = next;
  }
  return (l << 16) | r;
}

uint32_t MrTable::unmix(uint32_t key) const noexcept {
  uint32_t l = key >> 16, r = key & 0xffff;
  for (int i = kRounds - 1; i >= 0; --i) {
    const uint32_t prev = r ^ round_fn(i, l);
    r = l;
    l = prev;
  }
  return (l << 16) | r;
}

uint32_t MrTable::make_key(uint32_t slot) {
  // A fresh random tag per registration: a stale key of a reused slot fails.
  for (;;) {
    const uint32_t key = mix((static_cast<uint32_t>(random64()) & 0xffff0000u) | slot);
    if (key != 0) return key;  // 0 marks a free slot
  }
}

MrEntry* MrTable::add(uint64_t addr, uint64_t length, uint32_t access) {
  std::lock_guard lock(mu_);
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (next_ < kSlots) {
    slot = next_++;
  } else {
    throw Error("register_memory", "tcp", "", ENOSPC, "region table is full (65535)");
  }
  MrEntry& e = slots_[slot];
  e.addr = addr;
  e.length = length;
  e.access = access;
  e.lkey.store(make_key(slot), std::memory_order_relaxed);
  e.rkey.store(make_key(slot), std::memory_order_release);
  return &e;
}

void MrTable::revoke(MrEntry* e) noexcept {
  // Dekker with acquire(): either it sees rkey == 0 or the caller, reading
  // users afterwards, sees its pin.
  e->lkey.store(0, std::memory_order_seq_cst);
  e->rkey.store(0, std::memory_order_seq_cst);
}

void MrTable::free_slot(MrEntry* e) noexcept {
  std::lock_guard lock(mu_);
  free_.push_back(static_cast<uint32_t>(e - slots_.get()));
}

namespace {
bool range_ok(uint64_t base, uint64_t size, uint64_t addr, uint64_t len) noexcept {
  // Overflow-safe: addr >= base && addr + len <= base + size.
  return addr >= base && len <= size && addr - base <= size - len;
}
}  // namespace

MrEntry* MrTable::acquire(uint32_t rkey, uint64_t addr, uint64_t len,
                          uint32_t need) noexcept {
  if (rkey == 0) return nullptr;
  MrEntry& e = slots_[slot_of(rkey)];
  e.users.fetch_add(1, std::memory_order_seq_cst);
  if (e.rkey.load(std::memory_order_seq_cst) != rkey || (e.access & need) != need ||
      !range_ok(e.addr, e.length, addr, len)) {
    e.users.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  return &e;
}

bool MrTable::check_local(uint32_t lkey, const void* addr, uint64_t len,
                          uint32_t need) const noexcept {
  if (lkey == 0) return false;
  const MrEntry& e = slots_[slot_of(lkey)];
  return e.lkey.load(std::memory_order_acquire) == lkey && (e.access & need) == need &&
         range_ok(e.addr, e.length, reinterpret_cast<uint64_t>(addr), len);
}

TcpMr::~TcpMr() {
  progress_->deregister(entry_);
  if (mapped_) ::munmap(addr(), length());
}

}  // namespace rdmakit::tcp
