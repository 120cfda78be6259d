// The blocking mode is built once on the provider's poll/arm/fd.
#include "rdmakit/completion_queue.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>

namespace rdmakit {

int CompletionQueue::wait(std::span<Completion> out,
                          std::chrono::nanoseconds timeout) noexcept {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto spin_until = start + std::min(timeout, options_.spin);
  do {
    if (int n = poll(out); n != 0) return n;
  } while (Clock::now() < spin_until);

  for (;;) {
    if (arm()) {
      const auto left = deadline - Clock::now();
      if (left <= std::chrono::nanoseconds::zero()) return poll(out);
      // Round up so a sub-millisecond remainder still sleeps.
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left);
      pollfd pfd{fd(), POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms.count(), 1 << 30)));
    }
    if (int n = poll(out); n != 0) return n;
    if (Clock::now() >= deadline) return 0;
  }
}

}  // namespace rdmakit
