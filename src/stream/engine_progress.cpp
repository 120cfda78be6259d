// Who watches the completion queue: the progress thread (asleep on the
// CQ's fd when no application thread polls, off it while one spins), and
// the readiness polls of application threads. EngineImpl::wait, the
// blocking calls' spin-then-sleep, is in engine.hpp.
#include <poll.h>
#include <unistd.h>

#include "stream/engine.hpp"

namespace rdmakit::stream::detail {

void EngineImpl::kick() noexcept {
  const uint64_t one = 1;
  (void)::write(kick_fd_, &one, sizeof one);
}

void EngineImpl::before_would_block() noexcept {
  // An event-loop caller sleeps next: someone must be armed on the CQ.
  sleeper_ = true;
  if (progress_ == Progress::kSleepUnarmed) {
    progress_ = Progress::kRunning;
    kick();
  }
}

short EngineImpl::poll_readiness(StreamCore& s, bool about_to_sleep,
                                 bool reads_next) noexcept {
  // A poll disarms the CQ: a progress thread sleeping armed would no longer
  // be woken by arrivals, so it is sent back to look (as a spinning waiter
  // does). A spinning caller also counts as busy-polling, which keeps the
  // progress thread off the CQ (no wake-up syscall per peer message) while
  // the calls go on.
  if (!about_to_sleep) ++spin_epoch_;
  if (progress_ == Progress::kSleepArmed) {
    progress_ = Progress::kRunning;
    kick();
  }
  s.begin_poll(reads_next, about_to_sleep);
  drain();
  s.update();
  s.end_poll();
  const short ev = s.events();
  if (about_to_sleep) before_would_block();
  return ev;
}

void EngineImpl::progress_loop() noexcept {
  std::unique_lock lock(mu);
  auto next_timers = Clock::now() + tick_;
  uint64_t seen_epoch = spin_epoch_;
  while (!stop_) {
    drain();
    const auto now = Clock::now();
    if (now >= next_timers) {
      timers(now);
      next_timers = now + tick_;
    }
    bool armed = false;
    int timeout_ms;
    if ((spinning_ > 0 || spin_epoch_ != seen_epoch) && !sleeper_) {
      // Application threads poll the CQ themselves: stay off it (arming
      // would make every peer message a wake-up syscall) and look again soon.
      seen_epoch = spin_epoch_;
      progress_ = Progress::kSleepUnarmed;
      timeout_ms = 2;
    } else {
      seen_epoch = spin_epoch_;
      sleeper_ = false;
      if (!cq->arm()) continue;  // completions pending
      armed = true;
      progress_ = Progress::kSleepArmed;
      timeout_ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next_timers - now)
              .count() +
          1);
    }
    lock.unlock();
    pollfd fds[2] = {{kick_fd_, POLLIN, 0}, {cq->fd(), POLLIN, 0}};
    (void)::poll(fds, armed ? 2 : 1, timeout_ms);
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t v;
      (void)::read(kick_fd_, &v, sizeof v);
    }
    lock.lock();
    progress_ = Progress::kRunning;
  }
}

}  // namespace rdmakit::stream::detail
