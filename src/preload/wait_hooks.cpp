// poll, epoll_wait and select with a bounded busy-poll (docs/preload.md,
// "Busy polling"): with RDMAKIT_PRELOAD_BUSY_POLL_US set and at least one
// upgraded connection in the process, a wait that would sleep first asks
// the kernel again with a zero timeout for up to that long, so a reply
// mirrored onto a readiness socket is seen without a sleep and a wake-up.
// Unset (the default) or with no upgraded connection, each call goes
// straight to libc: an idle program sleeps as it would without the library.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <chrono>
#include <cstring>

#include "libc.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using Clock = std::chrono::steady_clock;

// The spin budget for a wait of timeout_ms (negative: forever); zero when
// the call should not spin.
std::chrono::microseconds budget(int timeout_ms) {
  if (timeout_ms == 0 || !any_upgraded()) return std::chrono::microseconds(0);
  const auto spin = config().busy_poll;
  if (timeout_ms > 0 && std::chrono::milliseconds(timeout_ms) < spin) {
    return std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::milliseconds(timeout_ms));
  }
  return spin;
}

// What is left of timeout_ms after `spent` (never below 0; -1 stays -1).
int left(int timeout_ms, Clock::duration spent) {
  if (timeout_ms < 0) return timeout_ms;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(spent).count();
  return ms >= timeout_ms ? 0 : timeout_ms - static_cast<int>(ms);
}

}  // namespace

EXPORT int poll(pollfd* fds, nfds_t n, int timeout) {
  const auto spin = budget(timeout);
  if (spin.count() == 0) return real().poll(fds, n, timeout);
  const auto start = Clock::now();
  do {
    const int r = real().poll(fds, n, 0);
    if (r != 0) return r;
  } while (Clock::now() - start < spin);
  return real().poll(fds, n, left(timeout, Clock::now() - start));
}

EXPORT int epoll_wait(int epfd, epoll_event* events, int max, int timeout) {
  const auto spin = budget(timeout);
  if (spin.count() == 0) return real().epoll_wait(epfd, events, max, timeout);
  const auto start = Clock::now();
  do {
    const int r = real().epoll_wait(epfd, events, max, 0);
    if (r != 0) return r;
  } while (Clock::now() - start < spin);
  return real().epoll_wait(epfd, events, max, left(timeout, Clock::now() - start));
}

EXPORT int select(int n, fd_set* rd, fd_set* wr, fd_set* ex, timeval* tv) {
  const int timeout =
      tv == nullptr ? -1 : static_cast<int>(tv->tv_sec * 1000 + tv->tv_usec / 1000);
  const auto spin =
      budget(tv != nullptr && timeout == 0 && tv->tv_usec > 0 ? 1 : timeout);
  if (spin.count() == 0) return real().select(n, rd, wr, ex, tv);
  // select overwrites its sets: each try starts from the caller's.
  fd_set r0;
  fd_set w0;
  fd_set e0;
  if (rd != nullptr) r0 = *rd;
  if (wr != nullptr) w0 = *wr;
  if (ex != nullptr) e0 = *ex;
  const auto start = Clock::now();
  for (;;) {
    timeval zero{0, 0};
    const int r = real().select(n, rd, wr, ex, &zero);
    if (r != 0) return r;
    if (rd != nullptr) *rd = r0;
    if (wr != nullptr) *wr = w0;
    if (ex != nullptr) *ex = e0;
    if (Clock::now() - start >= spin) break;
  }
  if (tv == nullptr) return real().select(n, rd, wr, ex, nullptr);
  const auto spent =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec - spent;
  if (us < 0) us = 0;
  timeval rest{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  const int r = real().select(n, rd, wr, ex, &rest);
  *tv = rest;  // Linux reports the time not slept
  return r;
}
