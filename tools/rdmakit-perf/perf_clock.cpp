#include "perf_clock.hpp"

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace rdmakit::perf {
namespace {

uint64_t steady_ns() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// The TSC is only a clock when it ticks at a constant rate in every P/C-state.
bool tsc_invariant() {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}

}  // namespace

void Clock::init() {
  use_tsc_ = tsc_invariant();
  if (!use_tsc_) {
    ns_per_tick_ = 1.0;
    return;
  }
#if defined(__x86_64__)
  const uint64_t ns0 = steady_ns();
  const uint64_t t0 = __rdtsc();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t ns1 = steady_ns();
  const uint64_t t1 = __rdtsc();
  if (t1 > t0 && ns1 > ns0) {
    ns_per_tick_ = static_cast<double>(ns1 - ns0) / static_cast<double>(t1 - t0);
  } else {
    use_tsc_ = false;
    ns_per_tick_ = 1.0;
  }
#endif
}

uint64_t Clock::now() noexcept {
#if defined(__x86_64__)
  if (use_tsc_) return __rdtsc();
#endif
  return steady_ns();
}

const char* Clock::source() noexcept { return use_tsc_ ? "rdtsc" : "steady_clock"; }

}  // namespace rdmakit::perf
