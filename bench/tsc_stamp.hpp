#pragma once
// Latency loops' timestamps, taken as rdmakit-perf takes them (one per
// iteration; rdtsc where the TSC is invariant, calibrated against
// steady_clock, else steady_clock), so bench figures and the core's are
// measured alike.
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace rdmakit::bench {

class Stamp {
 public:
  Stamp() {
#if defined(__x86_64__)
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) == 0) {
        tsc_ = line.find(" constant_tsc") != std::string::npos &&
               line.find(" nonstop_tsc") != std::string::npos;
        break;
      }
    }
    if (tsc_) {
      const auto c0 = std::chrono::steady_clock::now();
      const uint64_t t0 = __rdtsc();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto c1 = std::chrono::steady_clock::now();
      const uint64_t t1 = __rdtsc();
      us_per_tick_ = std::chrono::duration<double, std::micro>(c1 - c0).count() /
                     static_cast<double>(t1 - t0);
    }
#endif
  }
  uint64_t now() const noexcept {
#if defined(__x86_64__)
    if (tsc_) return __rdtsc();
#endif
    return static_cast<uint64_t>(
        std::chrono::steady_clock::now().time_since_epoch().count());
  }
  double us(uint64_t ticks) const noexcept {
    return tsc_ ? static_cast<double>(ticks) * us_per_tick_
                : static_cast<double>(ticks) * 1e6 *
                      std::chrono::steady_clock::period::num /
                      std::chrono::steady_clock::period::den;
  }

 private:
  bool tsc_ = false;
  double us_per_tick_ = 0;
};

}  // namespace rdmakit::bench
