#pragma once
// Timestamps for the measured loops: rdtsc where the TSC is invariant (one
// instruction, no vDSO call), calibrated once against steady_clock; otherwise
// steady_clock itself. Either way a tick converts to nanoseconds by ns().
#include <cstdint>

namespace rdmakit::perf {

class Clock {
 public:
  // Calibrates (about 20 ms). Call once at start-up, outside measured loops.
  static void init();
  static uint64_t now() noexcept;
  static double ns(uint64_t ticks) noexcept {
    return static_cast<double>(ticks) * ns_per_tick_;
  }
  static double us(uint64_t ticks) noexcept { return ns(ticks) / 1000.0; }
  // Ticks in `nanoseconds`, for deadlines.
  static uint64_t ticks(uint64_t nanoseconds) noexcept {
    return static_cast<uint64_t>(static_cast<double>(nanoseconds) / ns_per_tick_);
  }
  static const char* source() noexcept;

 private:
  static inline double ns_per_tick_ = 1.0;
  static inline bool use_tsc_ = false;
};

}  // namespace rdmakit::perf
