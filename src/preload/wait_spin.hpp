#pragma once
// Readiness of upgraded connections taken from the stream's ring on the
// caller's thread (Stream::poll_readiness), for the wait hooks and the
// blocking data path: a message the peer put into the ring is seen at once,
// without waiting for the engine's progress thread to mirror it onto the
// readiness socket (a wake-up of 40-60 us).
//
// One poll_readiness() call drains the engine's whole completion queue and
// brings every stream's readiness socket up to date, so a wait set needs one
// call per engine (shm, cross-host), not one per connection; after it the
// kernel's answer for the readiness sockets is current.
#include <sys/types.h>

#include <chrono>
#include <memory>

#include "state.hpp"

namespace rdmakit::preload {

using SpinClock = std::chrono::steady_clock;

// Whether a wait hook may look at upgraded connections from this thread:
// only with a spin budget, never on the engine's own threads (fd_place.hpp),
// never in a process without upgraded connections (it goes straight to
// libc).
bool wait_may_spin() noexcept;

// How long a wait of timeout_ms (negative: forever) spins before it sleeps:
// RDMAKIT_PRELOAD_BUSY_POLL_US, never beyond the caller's timeout.
std::chrono::microseconds spin_budget(int timeout_ms) noexcept;

// One connection per engine of a wait set, to drain each engine.
class EngineDrain {
 public:
  // Keeps c if it is this process's and its engine has no representative
  // (a copy only then: a wait's other connections cost no count update).
  // Returns whether c may be used here (a forked child's copy may not).
  bool add(const std::shared_ptr<Conn>& c) noexcept;
  // The same for a live c known by its weak reference (a user-mode epoll
  // view), for a caller in process `self`: ref is locked only when c's
  // engine has no representative yet. Inline: called per registration.
  bool add(const Conn& c, const std::weak_ptr<Conn>& ref, pid_t self) noexcept {
    if (c.owner != self) return false;
    auto& slot = c.remote ? remote_ : shm_;
    if (!slot) slot = ref.lock();
    return true;
  }
  bool empty() const noexcept { return !shm_ && !remote_; }
  bool full() const noexcept { return shm_ && remote_; }
  // Spinning: collects arrivals on the caller's thread, no syscall.
  void drain() noexcept;
  // Before sleeping in the kernel: collects arrivals once more and makes
  // sure the progress thread watches for the next ones. Then lets go of its
  // connections: an epoll sleep keeps none open (a connection of the set
  // that another thread closes meanwhile ends at once, as with the kernel's
  // epoll; poll() and select() keep theirs, as the kernel pins the files
  // they wait on).
  void before_sleep() noexcept;

 private:
  std::shared_ptr<Conn> shm_;
  std::shared_ptr<Conn> remote_;
};

// What is left of timeout_ms after `spent` (never below 0; -1 stays -1).
int timeout_left(int timeout_ms, SpinClock::duration spent) noexcept;

// Between two tries of a spin: a pause, and every 64 tries the core is
// offered to whoever else is runnable (the peer may share it).
void spin_pause(unsigned tries) noexcept;

}  // namespace rdmakit::preload
