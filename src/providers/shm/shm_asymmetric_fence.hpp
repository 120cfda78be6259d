#pragma once
// An asymmetric fence for the wake-up handshake (a sender publishes a
// completion then checks whether the receiver sleeps; the receiver announces
// it sleeps then re-checks for completions). Without it both sides need a
// full fence. With membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) the rare side
// (a receiver going to sleep) pays a system call and the per-message side (a
// sender) only a compiler barrier: the kernel runs a full barrier on every
// CPU that executes a registered process.
namespace rdmakit::shm {

// ThreadSanitizer cannot see the barrier membarrier() runs on other CPUs:
// code that pairs heavy_fence() with a compiler barrier uses sequentially
// consistent operations instead when it is built with TSan.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// Registers this process on first use. True if the kernel offers the global
// expedited barrier and registration succeeded; the fallback is logged.
bool asymmetric_fence_available() noexcept;

// The receiver's side: a full barrier on every CPU running a registered
// process. Call only when asymmetric_fence_available().
void heavy_fence() noexcept;

}  // namespace rdmakit::shm
