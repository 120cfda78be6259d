// poll, select, epoll_wait and epoll_ctl, and the announcements of ppoll,
// pselect and epoll_pwait (docs/preload.md, "Busy
// polling"). A wait whose set holds upgraded connections first collects
// what their peers put into the rings on the caller's thread
// (wait_spin.hpp), for up to RDMAKIT_PRELOAD_BUSY_POLL_US, and returns as
// soon as something is ready; then it makes sure the progress thread
// watches and sleeps in the kernel on the readiness sockets as before.
// poll/select sets made only of upgraded connections are answered without
// a syscall; mixed sets ask the kernel with a zero timeout after each drain
// (the readiness sockets are current then, so every kernel semantic holds).
// epoll sets in user mode (epoll_set.hpp) are answered from the streams and
// their epoll_ctl calls kept in user space; other epoll sets drain, then ask
// the kernel. Any kernel look at an upgraded fd first makes its readiness
// socket current (kernel_looks_at, KernelEpollWait). Sets without upgraded
// connections, a zero timeout, the engine's own threads and processes
// without upgraded connections go straight to libc.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "early_send.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "hook.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "relay.hpp"
#include "state.hpp"
#include "wait_spin.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

// Sets up to this size made only of upgraded connections are answered from
// the streams directly (one poll_readiness per entry and try).
constexpr size_t kMaxDirect = 16;

bool waits_for_input(const pollfd& p) {
  return (p.events & (POLLIN | POLLPRI | POLLRDNORM | POLLRDBAND)) != 0;
}

// The kernel is about to look at fd (poll, select): an upgraded
// connection's readiness socket must be current, and an epoll set polled
// leaves user mode (epoll_set.hpp). Returns fd's connection, if any, so that
// a wait looks each fd up once. reads: the wait is for input (a dormant
// relay starts delivering; a wait to write leaves it dormant).
std::shared_ptr<Conn> kernel_looks_at(int fd, bool reads) {
  if (!is_conn(fd)) {
    epoll_seen_by_kernel(fd);
    return nullptr;
  }
  if (!reads && wait_to_send_in_kernel(fd)) return nullptr;
  std::shared_ptr<Conn> c;
  {
    const SignalHold hold(settles_first(fd));
    c = find_conn(fd, reads);
  }
  if (c) keep_readiness_current(*c);
  return c;
}

// Not const: glibc declares poll's array write-only, and a const pointer
// to it would count as reading memory the caller need not have set.
void kernel_looks_at(pollfd* fds, nfds_t n) {
  if ((!any_upgraded() && !any_pending()) || engine_thread()) return;
  for (nfds_t i = 0; i < n; ++i) {
    if (fds[i].fd >= 0) (void)kernel_looks_at(fds[i].fd, waits_for_input(fds[i]));
  }
}

bool in(const fd_set* s, int fd) { return s != nullptr && FD_ISSET(fd, s); }

// A signal came while the wait upgraded a connection it names (kernel_looks_at):
// poll and select end with EINTR whatever SA_RESTART says (signal(7)).
bool ended_by_signal() {
  if (!interrupted(false)) return false;
  errno = EINTR;
  return true;
}

void kernel_looks_at(int n, const fd_set* rd, const fd_set* wr, const fd_set* ex) {
  if ((!any_upgraded() && !any_pending()) || engine_thread() || n <= 0 || n > FD_SETSIZE)
    return;
  for (int fd = 0; fd < n; ++fd) {
    if (in(rd, fd) || in(wr, fd) || in(ex, fd))
      (void)kernel_looks_at(fd, in(rd, fd) || in(ex, fd));
  }
}

// The events the readiness socket shows for the stream's state
// (Stream::poll_events; a hang-up ends the read side too), as poll reports
// them: what was asked, and POLLERR and POLLHUP always.
short mirrored(short ev, short asked) {
  if ((ev & POLLHUP) != 0) ev = static_cast<short>(ev | POLLRDHUP);
  return static_cast<short>(ev & (asked | POLLERR | POLLHUP));
}

// Bytes a relayed process gave back (relay.hpp) wait outside the stream,
// where its readiness socket does not show them: a wait that asks for
// POLLIN on such a connection answers at once. -1: none in the set.
int answer_pushback(pollfd* fds, nfds_t n) {
  if (any_relayed()) {
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].fd < 0 || (fds[i].events & POLLIN) == 0 ||
          entry_of(fds[i].fd) != Entry::kConn)
        continue;
      if (auto c = find_conn(fds[i].fd); c && c->relays() > 0) reclaim_relays(*c);
    }
  }
  if (!any_pushback()) return -1;
  bool any = false;
  for (nfds_t i = 0; i < n && !any; ++i) {
    if (fds[i].fd < 0 || (fds[i].events & POLLIN) == 0 || !is_conn(fds[i].fd)) continue;
    auto c = find_conn(fds[i].fd);
    any = c && c->has_pushback();
  }
  if (!any) return -1;
  int r = real().poll(fds, n, 0);
  if (r < 0) return r;
  r = 0;
  for (nfds_t i = 0; i < n; ++i) {
    if (fds[i].fd >= 0 && (fds[i].events & POLLIN) != 0 && is_conn(fds[i].fd)) {
      auto c = find_conn(fds[i].fd);
      if (c && c->has_pushback()) fds[i].revents |= POLLIN;
    }
    if (fds[i].revents != 0) ++r;
  }
  return r;
}

}  // namespace

EXPORT int poll(pollfd* fds, nfds_t n, int timeout) {
  if (const int r = answer_pushback(fds, n); r >= 0) return r;
  const SignalWatch watch;
  if (timeout == 0 || n == 0 || !wait_may_spin()) {
    kernel_looks_at(fds, n);
    if (timeout != 0 && ended_by_signal()) return -1;
    return real().poll(fds, n, timeout);
  }
  EngineDrain engines;
  std::array<std::shared_ptr<Conn>, kMaxDirect> direct;
  bool all_conns = n <= kMaxDirect;
  // Each fd looked up once: kernel_looks_at(fd) before any kernel call below.
  for (nfds_t i = 0; i < n; ++i) {
    const int fd = fds[i].fd;
    if (fd < 0) continue;
    auto c = kernel_looks_at(fd, waits_for_input(fds[i]));
    const bool usable = engines.add(c);
    if (all_conns && usable) {
      direct[i] = std::move(c);
    } else {
      all_conns = false;
    }
  }
  if (ended_by_signal()) return -1;
  if (engines.empty()) return real().poll(fds, n, timeout);
  const auto spin = spin_budget(timeout);
  if (spin.count() == 0) return real().poll(fds, n, timeout);
  const auto start = SpinClock::now();
  for (unsigned tries = 0;; ++tries) {
    int r = 0;
    if (all_conns) {
      for (nfds_t i = 0; i < n; ++i) {
        fds[i].revents = 0;
        if (fds[i].fd < 0) continue;
        fds[i].revents =
            mirrored(direct[i]->stream->poll_readiness(false), fds[i].events);
        if (fds[i].revents != 0) ++r;
      }
    } else {
      engines.drain();
      r = real().poll(fds, n, 0);
    }
    if (r != 0) return r;
    if (SpinClock::now() - start >= spin) break;
    spin_pause(tries);
  }
  engines.before_sleep();
  return real().poll(fds, n, timeout_left(timeout, SpinClock::now() - start));
}

EXPORT int epoll_wait(int epfd, epoll_event* events, int max, int timeout) {
  int answer = 0;
  if (user_epoll_wait(epfd, events, max, timeout, &answer)) return answer;
  if (timeout == 0 || !wait_may_spin())
    return real().epoll_wait(epfd, events, max, timeout);
  EngineDrain engines;
  if (!epoll_engines(epfd, &engines))
    return real().epoll_wait(epfd, events, max, timeout);
  const auto spin = spin_budget(timeout);
  if (spin.count() == 0) return real().epoll_wait(epfd, events, max, timeout);
  const auto start = SpinClock::now();
  for (unsigned tries = 0;; ++tries) {
    engines.drain();
    const int r = real().epoll_wait(epfd, events, max, 0);
    if (r != 0) return r;
    if (SpinClock::now() - start >= spin) break;
    spin_pause(tries);
  }
  const KernelEpollWait current(epfd);
  engines.before_sleep();
  return real().epoll_wait(epfd, events, max,
                           timeout_left(timeout, SpinClock::now() - start));
}

EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event* event) {
  // A registration is a use: it must name the file that carries the data.
  // An upgraded entry already does (one load: redis-benchmark ADDs twice per
  // request); others are settled first.
  if (fd_word(fd) < kConnWord && entry_of(fd) == Entry::kPending && !engine_thread()) {
    // Registered by its kernel socket while its first sends go early.
    if (EarlyEpoll early(epfd, op, fd, event); early) {
      const int r = real().epoll_ctl(epfd, op, fd, event);
      if (r == 0) track_epoll_ctl(epfd, op, fd, event);
      return early.done(r);
    }
  }
  if (op != EPOLL_CTL_DEL && fd_word(fd) < kConnWord && is_conn(fd) && !engine_thread()) {
    const bool reads =
        event != nullptr && (event->events & (EPOLLIN | EPOLLPRI | EPOLLRDNORM)) != 0;
    // A modification matters only to a dormant relay that starts to read.
    if (op == EPOLL_CTL_ADD || (reads && entry_of(fd) == Entry::kDormant))
      (void)find_conn(fd, reads);
  }
  int answer = 0;
  if (!engine_thread() && user_epoll_ctl(epfd, op, fd, event, &answer)) return answer;
  const int r = real().epoll_ctl(epfd, op, fd, event);
  if (r == 0 && !engine_thread()) track_epoll_ctl(epfd, op, fd, event);
  return r;
}

namespace {

// select's sets as they were passed (select overwrites them).
struct FdSets {
  fd_set rd;
  fd_set wr;
  fd_set ex;
  void save(const fd_set* r, const fd_set* w, const fd_set* e) {
    if (r != nullptr) rd = *r;
    if (w != nullptr) wr = *w;
    if (e != nullptr) ex = *e;
  }
  void restore(fd_set* r, fd_set* w, fd_set* e) const {
    if (r != nullptr) *r = rd;
    if (w != nullptr) *w = wr;
    if (e != nullptr) *e = ex;
  }
};

}  // namespace

EXPORT int select(int n, fd_set* rd, fd_set* wr, fd_set* ex, timeval* tv) {
  const bool zero = tv != nullptr && tv->tv_sec == 0 && tv->tv_usec == 0;
  const SignalWatch watch;
  if (zero || n <= 0 || n > FD_SETSIZE || !wait_may_spin()) {
    kernel_looks_at(n, rd, wr, ex);
    if (!zero && ended_by_signal()) return -1;
    return real().select(n, rd, wr, ex, tv);
  }
  EngineDrain engines;
  std::array<std::shared_ptr<Conn>, kMaxDirect> direct;
  std::array<int, kMaxDirect> direct_fd{};
  size_t ndirect = 0;
  bool all_conns = true;
  // Each fd looked up once: kernel_looks_at(fd) before any kernel call below.
  for (int fd = 0; fd < n; ++fd) {
    if (!in(rd, fd) && !in(wr, fd) && !in(ex, fd)) continue;
    auto c = kernel_looks_at(fd, in(rd, fd) || in(ex, fd));
    const bool usable = engines.add(c);
    if (all_conns && usable && ndirect < kMaxDirect) {
      direct_fd[ndirect] = fd;
      direct[ndirect++] = std::move(c);
    } else {
      all_conns = false;
    }
  }
  if (ended_by_signal()) return -1;
  if (engines.empty()) return real().select(n, rd, wr, ex, tv);
  // Milliseconds, rounded up so a sub-millisecond timeout still spins.
  const int timeout =
      tv == nullptr ? -1
                    : static_cast<int>(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000);
  const auto spin = spin_budget(timeout);
  if (spin.count() == 0) return real().select(n, rd, wr, ex, tv);
  FdSets given{};
  given.save(rd, wr, ex);
  const auto start = SpinClock::now();
  for (unsigned tries = 0;; ++tries) {
    int r = 0;
    if (all_conns) {
      if (rd != nullptr) FD_ZERO(rd);
      if (wr != nullptr) FD_ZERO(wr);
      if (ex != nullptr) FD_ZERO(ex);
      for (size_t i = 0; i < ndirect; ++i) {
        const int fd = direct_fd[i];
        const short ev = direct[i]->stream->poll_readiness(false);
        if ((ev & POLLIN) != 0 && in(&given.rd, fd) && rd != nullptr) {
          FD_SET(fd, rd);
          ++r;
        }
        if ((ev & POLLOUT) != 0 && in(&given.wr, fd) && wr != nullptr) {
          FD_SET(fd, wr);
          ++r;
        }
      }
    } else {
      engines.drain();
      timeval now{0, 0};
      r = real().select(n, rd, wr, ex, &now);
    }
    if (r < 0) return r;
    if (r > 0) {
      if (tv != nullptr) {
        // Linux reports the time not slept.
        const auto spent = std::chrono::duration_cast<std::chrono::microseconds>(
                               SpinClock::now() - start)
                               .count();
        int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec - spent;
        if (us < 0) us = 0;
        *tv = {static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
      }
      return r;
    }
    given.restore(rd, wr, ex);
    if (SpinClock::now() - start >= spin) break;
    spin_pause(tries);
  }
  engines.before_sleep();
  if (tv == nullptr) return real().select(n, rd, wr, ex, nullptr);
  const auto spent =
      std::chrono::duration_cast<std::chrono::microseconds>(SpinClock::now() - start)
          .count();
  int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec - spent;
  if (us < 0) us = 0;
  timeval rest{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  const int r = real().select(n, rd, wr, ex, &rest);
  *tv = rest;  // Linux reports the time not slept
  return r;
}

// ppoll, pselect and epoll_pwait do not spin (their signal masks make a
// spin loop's zero-timeout probes a different call), but a sleep in them on
// upgraded connections is announced like the others' (EngineDrain::
// before_sleep): a non-blocking read that found nothing did not announce
// it (conn_io.cpp), and without the announcement the progress thread could
// still be in a 2 ms unarmed nap when the next message arrives.
EXPORT int ppoll(pollfd* fds, nfds_t n, const timespec* tmo, const sigset_t* mask) {
  if (const int r = answer_pushback(fds, n); r >= 0) return r;
  const bool zero = tmo != nullptr && tmo->tv_sec == 0 && tmo->tv_nsec == 0;
  const SignalWatch watch;
  if (zero || n == 0 || !wait_may_spin()) {
    kernel_looks_at(fds, n);
    if (!zero && ended_by_signal()) return -1;
    return real().ppoll(fds, n, tmo, mask);
  }
  {
    EngineDrain engines;
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].fd >= 0)
        (void)engines.add(kernel_looks_at(fds[i].fd, waits_for_input(fds[i])));
    }
    if (ended_by_signal()) return -1;
    engines.before_sleep();
  }
  return real().ppoll(fds, n, tmo, mask);
}

EXPORT int pselect(int n, fd_set* rd, fd_set* wr, fd_set* ex, const timespec* tmo,
                   const sigset_t* mask) {
  const bool zero = tmo != nullptr && tmo->tv_sec == 0 && tmo->tv_nsec == 0;
  const SignalWatch watch;
  if (zero || n <= 0 || n > FD_SETSIZE || !wait_may_spin()) {
    kernel_looks_at(n, rd, wr, ex);
    if (!zero && ended_by_signal()) return -1;
    return real().pselect(n, rd, wr, ex, tmo, mask);
  }
  {
    EngineDrain engines;
    for (int fd = 0; fd < n; ++fd) {
      if (in(rd, fd) || in(wr, fd) || in(ex, fd))
        (void)engines.add(kernel_looks_at(fd, in(rd, fd) || in(ex, fd)));
    }
    if (ended_by_signal()) return -1;
    engines.before_sleep();
  }
  return real().pselect(n, rd, wr, ex, tmo, mask);
}

EXPORT int epoll_pwait(int epfd, epoll_event* events, int max, int timeout,
                       const sigset_t* mask) {
  const KernelEpollWait current(epfd);  // readiness sockets current while it waits
  if (timeout != 0 && wait_may_spin()) {
    EngineDrain engines;
    if (epoll_engines(epfd, &engines)) engines.before_sleep();
  }
  return real().epoll_pwait(epfd, events, max, timeout, mask);
}

EXPORT int epoll_pwait2(int epfd, epoll_event* events, int max, const timespec* tmo,
                        const sigset_t* mask) {
  if (real().epoll_pwait2 == nullptr) {
    errno = ENOSYS;  // as a libc without it would answer
    return -1;
  }
  const KernelEpollWait current(epfd);  // readiness sockets current while it waits
  const bool zero = tmo != nullptr && tmo->tv_sec == 0 && tmo->tv_nsec == 0;
  if (!zero && wait_may_spin()) {
    EngineDrain engines;
    if (epoll_engines(epfd, &engines)) engines.before_sleep();
  }
  return real().epoll_pwait2(epfd, events, max, tmo, mask);
}

// The fortified variants (_FORTIFY_SOURCE with an array of known size):
// glibc's own check, then the hooks above.
EXPORT int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fds_len) {
  if (fds_len / sizeof(*fds) < n) return real().poll_chk(fds, n, timeout, fds_len);
  return poll(fds, n, timeout);
}

EXPORT int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* tmo, const sigset_t* mask,
                       size_t fds_len) {
  if (fds_len / sizeof(*fds) < n) return real().ppoll_chk(fds, n, tmo, mask, fds_len);
  return ppoll(fds, n, tmo, mask);
}
