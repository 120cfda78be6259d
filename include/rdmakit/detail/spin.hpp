#pragma once
// Waiting for another thread without a kernel object: the one spin policy of
// the library's short critical sections (a CQ's gate, a ring lock, a view
// lock). A few hundred nanoseconds of pause first, then sched_yield() on each
// try: the thread being waited for may have been preempted on this very core
// (a process pinned to one CPU, a loaded machine), and a spinner that kept
// the core would hold it off for a whole time slice (measured: 2-5 ms per
// shm connection setup with both threads of a process on one core).
#include <sched.h>

#include <cstdint>

namespace rdmakit::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class SpinBackoff {
 public:
  // Pauses before the first yield: a holder running on another core leaves
  // a short section sooner than a yield's system call returns.
  static constexpr uint32_t kPausesBeforeYield = 128;

  void pause() noexcept {
    if (tries_ < kPausesBeforeYield) {
      ++tries_;
      cpu_relax();
    } else {
      (void)sched_yield();
    }
  }

 private:
  uint32_t tries_ = 0;
};

// Spins (with SpinBackoff) until done() is true.
template <typename Done>
void spin_until(Done&& done) noexcept(noexcept(done())) {
  SpinBackoff backoff;
  while (!done()) backoff.pause();
}

}  // namespace rdmakit::detail
