#pragma once
// Atomic tests (atomic_lat, atomic_bw): each QP's WRs target one 8-byte
// counter in the peer's target slot. FETCH_ADD adds 1; the CMP_AND_SWAP with
// WR index i swaps i for i + 1, so each finds what the one before left and,
// in both cases, the counter ends at the number of WRs posted.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "perf.hpp"

namespace rdmakit::perf {

constexpr uint32_t kAtomicSize = 8;
constexpr uint64_t kFetchAddStep = 1;

inline Opcode atomic_opcode(AtomicOp op) noexcept {
  return op == AtomicOp::kCompareSwap ? Opcode::kCompareSwap : Opcode::kFetchAdd;
}

// Operands of the CMP_AND_SWAP with WR index `idx`.
inline void set_swap_operands(SendWr& wr, uint64_t idx) noexcept {
  wr.compare_add = idx;
  wr.swap = idx + 1;
}

// The target's counter, written by the peer's atomics.
inline uint64_t load_counter(std::byte* target) noexcept {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(target))
      .load(std::memory_order_acquire);
}

// What the counter must read after `posted` atomics of either kind.
constexpr uint64_t expected_counter(uint64_t posted) noexcept {
  return posted * kFetchAddStep;
}

}  // namespace rdmakit::perf
