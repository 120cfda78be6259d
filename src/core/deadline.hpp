#pragma once
// Deadlines of control-path waits (connect, accept, handshakes).
#include <algorithm>
#include <chrono>
#include <cstdint>

namespace rdmakit::core {

using Clock = std::chrono::steady_clock;

// Milliseconds until deadline, rounded up, 0 once it has passed: the timeout
// argument of poll(2) and of rdma_cm's resolve calls.
inline int ms_left(Clock::time_point deadline) noexcept {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

}  // namespace rdmakit::core
