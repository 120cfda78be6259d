#include "interruption.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <chrono>

#include "libc.hpp"
#include "rdmakit/detail/library_thread.hpp"

namespace rdmakit::preload {

__thread bool t_signal_noted __attribute__((tls_model("initial-exec"))) = false;

namespace {

// Watches entered on this thread: only the outermost (the application's
// call itself) may end with EINTR; a hooked call the library makes inside
// it (the core's own poll) may not take the note.
thread_local int t_watch_depth = 0;

// The asynchronous signals the application catches, and whether one of
// their handlers lacks SA_RESTART (only such a handler makes the kernel end
// a socket call with EINTR). Only caught signals can interrupt a call: one
// left to its default action or ignored never runs anything, so it is never
// held back (a Ctrl-C that kills is not delayed). Synchronous signals (a
// sanitizer's or a runtime's SIGSEGV handler) report faults, not events.
struct Caught {
  sigset_t set;
  bool any = false;
  bool without_restart = false;
};

Caught caught_signals() noexcept {
  static const sigset_t kAsynchronous = rdmakit::detail::asynchronous_signals();
  Caught c;
  sigemptyset(&c.set);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&kAsynchronous, sig) != 1) continue;
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    const bool caught = (sa.sa_flags & SA_SIGINFO) != 0
                            ? sa.sa_sigaction != nullptr
                            : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (!caught) continue;
    sigaddset(&c.set, sig);
    c.any = true;
    if ((sa.sa_flags & SA_RESTART) == 0) c.without_restart = true;
  }
  return c;
}

}  // namespace

int poll_through_signals(pollfd* fds, nfds_t n, int timeout_ms) noexcept {
  using Clock = std::chrono::steady_clock;
  const auto end =
      Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  for (;;) {
    const int r = real().poll(fds, n, timeout_ms);
    if (r >= 0 || errno != EINTR) return r;
    t_signal_noted = true;
    if (timeout_ms > 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now())
              .count();
      timeout_ms = left > 0 ? static_cast<int>(left) : 0;
    }
  }
}

SignalWatch::SignalWatch() noexcept : outer_(t_watch_depth == 0) {
  ++t_watch_depth;
  if (outer_) t_signal_noted = false;
}

SignalWatch::~SignalWatch() {
  --t_watch_depth;
  if (outer_) t_signal_noted = false;
}

SignalHold::SignalHold(bool hold) noexcept {
  if (!hold) return;
  // Asked at each settle (a connection's first use, about 1 ms): a handler
  // installed since counts.
  const Caught caught = caught_signals();
  if (!caught.any) return;
  held_ = pthread_sigmask(SIG_BLOCK, &caught.set, &before_) == 0;
}

SignalHold::~SignalHold() {
  if (!held_) return;
  const int saved = errno;
  sigset_t pending;
  if (sigpending(&pending) == 0) {
    for (int sig = 1; sig < NSIG; ++sig) {
      // Pending because of the hold, not because the application blocks it.
      if (sigismember(&pending, sig) == 1 && sigismember(&before_, sig) == 0) {
        t_signal_noted = true;
        break;
      }
    }
  }
  pthread_sigmask(SIG_SETMASK, &before_, nullptr);  // their handlers run now
  errno = saved;
}

bool signal_ends_call(bool restartable) noexcept {
  return !restartable || caught_signals().without_restart;
}

bool signal_ends_kernel_read(int fd) noexcept {
  if (t_watch_depth != 1 || !t_signal_noted) return false;
  const int saved = errno;
  pollfd p{fd, POLLIN, 0};
  const int fl = real().fcntl(fd, F_GETFL);
  timeval tv{};
  socklen_t len = sizeof tv;
  const bool timed = real().getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len) == 0 &&
                     (tv.tv_sec != 0 || tv.tv_usec != 0);
  const bool would_wait = fl >= 0 && (fl & O_NONBLOCK) == 0 && real().poll(&p, 1, 0) == 0;
  const bool ends = would_wait ? interrupted(!timed) : (t_signal_noted = false);
  errno = saved;
  return ends;
}

bool interrupted(bool restartable) noexcept {
  if (t_watch_depth != 1 || !t_signal_noted) return false;
  t_signal_noted = false;
  return signal_ends_call(restartable);
}

}  // namespace rdmakit::preload
