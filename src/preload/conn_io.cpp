#include "conn_io.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "epoll_set.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "stat.hpp"
#include "wait_spin.hpp"

namespace rdmakit::preload {

namespace {

using Clock = std::chrono::steady_clock;

size_t total_len(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// iov without its first `skip` bytes, in out (reused storage).
int advance(const iovec* iov, int n, size_t skip, std::vector<iovec>* out) {
  out->clear();
  for (int i = 0; i < n; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    out->push_back({static_cast<char*>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
    skip = 0;
  }
  return static_cast<int>(out->size());
}

// The end of a call's SO_RCVTIMEO/SO_SNDTIMEO of tmo_us: the clock is read
// only for a call that may wait with a timeout set.
Clock::time_point timed_deadline(bool timed, int64_t tmo_us) {
  return timed ? Clock::now() + std::chrono::microseconds(tmo_us) : Clock::time_point{};
}

// Waits for `events` on fd until deadline (or forever). 0 ready, -EAGAIN
// timed out, -EINTR interrupted by a signal (the caller restarts the wait
// as the kernel would: signal_ends_call).
int wait_for(Conn& c, int fd, short events, bool has_deadline,
             Clock::time_point deadline) {
  // A signal that came while this call upgraded the connection: the kernel
  // would have ended the wait with it (a write that must wait for room).
  if (interrupted_now(!has_deadline)) return -EINTR;
  keep_readiness_current(c);  // it sleeps on the readiness socket
  int timeout = -1;
  if (has_deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
            .count();
    if (left <= 0) return -EAGAIN;
    timeout = static_cast<int>(left);
  }
  pollfd p{fd, events, 0};
  const int r = real().poll(&p, 1, timeout);  // already spun: sleep now
  if (r < 0) return -errno;
  if (r == 0) return -EAGAIN;
  return 0;
}

// The spin of one blocking call (RDMAKIT_PRELOAD_BUSY_POLL_US): readiness
// is taken from the ring on the caller's thread (Stream::poll_readiness)
// until the stream shows what the call waits for or the budget is spent.
class Spin {
 public:
  Spin(bool blocking, bool has_deadline, Clock::time_point deadline)
      : on_(blocking && config().busy_poll.count() > 0),
        has_deadline_(has_deadline),
        deadline_(deadline) {}
  bool active() const { return on_; }
  // Whether the ring was polled: the progress thread must then be sent
  // back to watch before the caller sleeps (poll_readiness(true)).
  bool spun() const { return spun_; }
  void stop() { on_ = false; }
  // Whether the stream shows `events` (or an error, end of stream) before
  // the budget runs out. The budget starts at the first call.
  // reads_next: a read follows at once when POLLIN is found (no readiness
  // signal for the data it takes, Stream::poll_readiness).
  bool until(Conn& c, short events, bool reads_next) {
    const short want = static_cast<short>(events | POLLHUP | POLLERR);
    spun_ = true;
    if ((c.stream->poll_readiness(false, reads_next) & want) != 0) return true;
    if (!started_) {
      started_ = true;
      end_ = Clock::now() + config().busy_poll;
      if (has_deadline_ && deadline_ < end_) end_ = deadline_;
    }
    for (unsigned tries = 0;; ++tries) {
      if (Clock::now() >= end_) return false;
      spin_pause(tries);
      if ((c.stream->poll_readiness(false, reads_next) & want) != 0) return true;
    }
  }

 private:
  bool on_;
  bool has_deadline_;
  Clock::time_point deadline_;
  bool started_ = false;
  bool spun_ = false;
  Clock::time_point end_{};
};

}  // namespace

int take_stream_error(Conn& c) noexcept {
  const int err = c.stream->error();
  if (err == 0) return 0;
  // A stream that fails after the peer's end of stream is a peer that closed
  // and left, not a reset: nothing is pending (SO_ERROR 0, reads see the end
  // of stream); writes get EPIPE (conn_send), as in the kernel's CLOSE_WAIT.
  if (err == ECONNRESET && (c.stream->poll_events() & POLLRDHUP) != 0) {
    c.stream->hide_error();
    return 0;
  }
  if (c.error_reported.exchange(true, std::memory_order_acq_rel)) return 0;
  c.stream->hide_error();  // reported: the fd stops showing POLLERR, as the kernel's
  return err;
}

namespace {

ssize_t recv_impl(Conn& c, int fd, const iovec* iov, int iovcnt, int flags) {
  const bool nonblocking =
      c.nonblocking.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT) != 0;
  const bool peek = (flags & MSG_PEEK) != 0;
  const bool wait_all = (flags & MSG_WAITALL) != 0 && !peek && !nonblocking;
  const size_t want = total_len(iov, iovcnt);
  const int64_t tmo = c.rcv_timeout_us.load(std::memory_order_relaxed);
  const bool timed = tmo > 0 && !nonblocking;
  const auto deadline = timed_deadline(timed, tmo);
  // A signal that came while this call upgraded the connection came while
  // the call waited: the bytes the upgrade brought stay for the next read.
  if (!nonblocking && interrupted_now(!timed)) {
    errno = EINTR;
    return -1;
  }
  Spin spin(!nonblocking, timed, deadline);
  // A non-blocking read of an empty stream: with a spin budget it looks at
  // the ring itself and, finding nothing, returns EAGAIN without telling the
  // engine its caller will sleep. A program that polls with non-blocking
  // reads (sockperf --nonblocked, a spinning event loop) would otherwise
  // keep the progress thread armed on the completion queue and learn of
  // each message only from its wake-up (measured: 15-17 us half round trip
  // instead of 3). A caller that does go to sleep next does so in a wait
  // hook, which announces it (Stream::poll_readiness(true)).
  const bool reads_next = !peek && want > 0;
  if (nonblocking && config().busy_poll.count() > 0 &&
      (c.stream->poll_readiness(false, reads_next) & (POLLIN | POLLHUP | POLLERR)) == 0) {
    errno = EAGAIN;
    return -1;
  }
  std::vector<iovec> rest;
  size_t got = 0;
  bool collected = false;
  for (;;) {
    // A read that finds nothing tells the engine its caller will sleep (a
    // wake-up of the progress thread): while spinning, look at the ring first.
    if (spin.active() && !spin.until(c, POLLIN, reads_next)) spin.stop();
    const iovec* v = iov;
    int n = iovcnt;
    if (got > 0) {
      n = advance(iov, iovcnt, got, &rest);
      v = rest.data();
    }
    const ssize_t r = c.stream->readv(v, n, (peek ? MSG_PEEK : 0) | MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      if (!wait_all || got == want) return static_cast<ssize_t>(got);
      continue;
    }
    if (r == 0 || (r != -EAGAIN && got > 0)) return static_cast<ssize_t>(got);
    if (r != -EAGAIN) {
      if (-r == c.stream->error()) {
        // The peer's last bytes and end of stream may still wait in the
        // completion queue behind the failure: collect them, read again.
        if (!collected) {
          collected = true;
          (void)c.stream->poll_readiness(false);
          continue;
        }
        if ((c.stream->poll_events() & POLLRDHUP) != 0) continue;  // reads them, then 0
        // Once, as the kernel reports a socket error; then end of stream.
        const int e = take_stream_error(c);
        if (e == 0) return 0;
        errno = e;
        return -1;
      }
      errno = static_cast<int>(-r);
      return -1;
    }
    if (nonblocking) {
      if (got > 0) return static_cast<ssize_t>(got);
      errno = EAGAIN;
      return -1;
    }
    if (spin.active()) continue;
    if (spin.spun() && (c.stream->poll_readiness(true) & POLLIN) != 0) continue;
    const int w = wait_for(c, fd, POLLIN, timed, deadline);
    if (w == -EINTR && !signal_ends_call(!timed)) continue;  // SA_RESTART
    if (w != 0) {
      if (got > 0) return static_cast<ssize_t>(got);
      errno = -w;
      return -1;
    }
  }
}

ssize_t send_impl(Conn& c, int fd, const iovec* iov, int iovcnt, int flags) {
  const bool nonblocking =
      c.nonblocking.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT) != 0;
  const size_t want = total_len(iov, iovcnt);
  const int64_t tmo = c.snd_timeout_us.load(std::memory_order_relaxed);
  const bool timed = tmo > 0 && !nonblocking;
  const auto deadline = timed_deadline(timed, tmo);
  Spin spin(!nonblocking, timed, deadline);
  std::vector<iovec> rest;
  size_t done = 0;
  for (;;) {
    const iovec* v = iov;
    int n = iovcnt;
    if (done > 0) {
      n = advance(iov, iovcnt, done, &rest);
      v = rest.data();
    }
    const ssize_t r = want == 0 ? 0 : c.stream->writev(v, n, MSG_DONTWAIT);
    if (r >= 0) {
      done += static_cast<size_t>(r);
      if (done == want || nonblocking) {
        if (done == 0 && want > 0) {
          errno = EAGAIN;
          return -1;
        }
        return static_cast<ssize_t>(done);
      }
      if (r > 0) continue;
    } else if (r != -EAGAIN) {
      if (done > 0) return static_cast<ssize_t>(done);
      int e = static_cast<int>(-r);
      if (e == c.stream->error()) {
        // The first write after the stream failed reports the error (no
        // signal unless it is EPIPE); later ones EPIPE, as kernel TCP.
        e = take_stream_error(c);
        if (e == 0) e = EPIPE;
      }
      if (e == EPIPE && (flags & MSG_NOSIGNAL) == 0) raise(SIGPIPE);
      errno = e;
      return -1;
    } else if (nonblocking) {
      if (done > 0) return static_cast<ssize_t>(done);
      errno = EAGAIN;
      return -1;
    }
    // Full: wait for room (credits the peer returns), from the ring first.
    if (spin.active() && spin.until(c, POLLOUT, false)) continue;
    spin.stop();
    if (spin.spun() && (c.stream->poll_readiness(true) & POLLOUT) != 0) continue;
    const int w = wait_for(c, fd, POLLOUT, timed, deadline);
    if (w == -EINTR && !signal_ends_call(!timed)) continue;  // SA_RESTART
    if (w != 0) {
      if (done > 0) return static_cast<ssize_t>(done);
      errno = -w;
      return -1;
    }
  }
}

}  // namespace

// The counters of the published statistics (stat.hpp): a load and a store
// each, no syscall, no locked instruction.
namespace {
// Bytes a relayed process gave back unread (relay.hpp) come first.
ssize_t recv_pushback(Conn& c, const iovec* iov, int iovcnt, int flags) {
  std::lock_guard lock(c.pushback_mu);
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < c.pushback.size(); ++i) {
    const size_t n = std::min(iov[i].iov_len, c.pushback.size() - done);
    std::memcpy(iov[i].iov_base, c.pushback.data() + done, n);
    done += n;
  }
  if ((flags & MSG_PEEK) == 0) {
    c.pushback.erase(0, done);
    if (c.pushback.empty() && c.mark_pushback(false)) count_pushback(-1);
  }
  return static_cast<ssize_t>(done);
}
}  // namespace

ssize_t conn_recv(Conn& c, int fd, const iovec* iov, int iovcnt, int flags) {
  if (c.detours.load(std::memory_order_acquire) != 0) [[unlikely]] {
    if (c.relays() > 0) reclaim_relays(c);
    if (c.has_pushback()) {
      const ssize_t n = recv_pushback(c, iov, iovcnt, flags);
      if (n > 0) return n;
    }
  }
  const ssize_t r = recv_impl(c, fd, iov, iovcnt, flags);
  if (r > 0 && (flags & MSG_PEEK) == 0)
    stats::count_rx(c.stat_slot, static_cast<size_t>(r));
  return r;
}

ssize_t conn_send(Conn& c, int fd, const iovec* iov, int iovcnt, int flags) {
  // Bytes a relayed process wrote before this call go first, as a kernel
  // socket's buffer keeps the writes of all its holders in order.
  if (c.relays() > 0) [[unlikely]]
    flush_relays(c);
  const ssize_t r = send_impl(c, fd, iov, iovcnt, flags);
  if (r > 0) stats::count_tx(c.stat_slot, static_cast<size_t>(r));
  return r;
}

}  // namespace rdmakit::preload
