#include "wait_spin.hpp"

#include <sched.h>

#include "fd_place.hpp"
#include "process.hpp"
#include "rdmakit/detail/spin.hpp"

namespace rdmakit::preload {

bool wait_may_spin() noexcept {
  // any_upgraded() first: config() is never read on the pass-through path.
  return !engine_thread() && any_upgraded() && config().busy_poll.count() > 0;
}

std::chrono::microseconds spin_budget(int timeout_ms) noexcept {
  const auto spin = config().busy_poll;
  if (timeout_ms >= 0 && std::chrono::milliseconds(timeout_ms) < spin) {
    return std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::milliseconds(timeout_ms));
  }
  return spin;
}

bool EngineDrain::add(const std::shared_ptr<Conn>& c) noexcept {
  if (!c || c->owner != process_id()) return false;
  auto& slot = c->remote ? remote_ : shm_;
  if (!slot) slot = c;
  return true;
}

void EngineDrain::drain() noexcept {
  if (shm_) (void)shm_->stream->poll_readiness(false);
  if (remote_) (void)remote_->stream->poll_readiness(false);
}

void EngineDrain::before_sleep() noexcept {
  if (shm_) (void)shm_->stream->poll_readiness(true);
  if (remote_) (void)remote_->stream->poll_readiness(true);
  shm_.reset();
  remote_.reset();
}

void spin_pause(unsigned tries) noexcept {
  if (tries % 64 == 63) {
    (void)sched_yield();
    return;
  }
  detail::cpu_relax();
}

int timeout_left(int timeout_ms, SpinClock::duration spent) noexcept {
  if (timeout_ms < 0) return timeout_ms;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(spent).count();
  return ms >= timeout_ms ? 0 : timeout_ms - static_cast<int>(ms);
}

}  // namespace rdmakit::preload
