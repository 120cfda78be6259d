// epoll_wait of a user-mode set (epoll_set.hpp): readiness of upgraded
// registrations from the streams, the kernel set asked for the rest, an
// adaptive spin, then a sleep in the kernel with everything current.
#include <sys/epoll.h>

#include <cerrno>
#include <chrono>
#include <vector>

#include "conn_guard.hpp"
#include "epoll_registry.hpp"
#include "epoll_set.hpp"
#include "libc.hpp"
#include "process.hpp"

namespace rdmakit::preload {

using ep::EpSet;
using ep::kernel_current;
using ep::remove_reg;
using ep::set_lazy;
using ep::Upgraded;

namespace {

// What the readiness socket would show for the stream's state, as epoll
// reports it for a registration of `asked` events.
uint32_t epoll_bits(short ev, uint32_t asked) {
  auto bits = static_cast<uint32_t>(static_cast<uint16_t>(ev));
  if ((bits & EPOLLHUP) != 0) bits |= EPOLLRDHUP;  // a hang-up ends the read side too
  return bits & (asked | EPOLLERR | EPOLLHUP);
}

// The spin of a user-mode set adapts to how soon its sleeps end: a sleep
// that a somewhat longer spin would have spared (events within
// kSpinGrowth x the configured spin) doubles the next spins, up to that
// bound; a sleep that ends later, or by its timeout, returns to the
// configured spin. A request/response load whose other end answers in
// bursts (redis-benchmark's 50 clients) keeps spinning between bursts, where
// each sleep would cost the progress thread's wake-up and a readiness signal
// per connection; an idle program sleeps after the configured spin.
constexpr int64_t kSpinGrowth = 16;

std::chrono::microseconds set_spin(const EpSet& s, int timeout_ms) {
  const int64_t base = config().busy_poll.count();
  int64_t us = s.spin_us.load(std::memory_order_relaxed);
  if (us < base) us = base;
  if (timeout_ms >= 0 && static_cast<int64_t>(timeout_ms) * 1000 < us)
    us = timeout_ms * 1000LL;
  return std::chrono::microseconds(us);
}

void adapt_spin(EpSet& s, int r, SpinClock::duration slept) {
  const int64_t base = config().busy_poll.count();
  const int64_t cap = base * kSpinGrowth;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(slept).count();
  int64_t next = base;
  if (r > 0 && us < cap) {
    next = std::max(base, s.spin_us.load(std::memory_order_relaxed)) * 2;
    if (next > cap) next = cap;
  }
  s.spin_us.store(next, std::memory_order_relaxed);
}

// One call's view of the upgraded registrations (reused storage: no
// allocation per call once warm). The connections are held by the thread's
// ConnView (conn_guard.hpp), not by a reference each: a count taken and
// dropped per registration per call cost two locked instructions each
// (100 per redis-server wait on 50 connections).
struct Snap {
  Conn* conn;
  uint32_t events;
  epoll_data_t data;
};
// Initial-exec (a preloaded library's TLS is static): with the default
// model the compiler recomputes a thread_local's address, a __tls_get_addr
// call, instead of keeping it across a call (once per registration scanned).
thread_local std::vector<Snap> t_snap __attribute__((tls_model("initial-exec")));
thread_local std::vector<uintptr_t> t_words __attribute__((tls_model("initial-exec")));

// The call's view of s: its upgraded registrations reported from user space,
// the engines to drain, where the round robin starts, and s->changes as of
// the view. false (after bringing the kernel set current) if s is not to be
// answered from user space now. Taken per call, not kept across calls: a
// kept view would hold its connections open (a stream ends with its last
// reference, so a closed one's peer would wait for this thread's next
// call). A connection closed while the call spins is freed when it returns.
bool take_view(EpSet* s, int epfd, EngineDrain* engines, std::vector<Snap>* snap,
               size_t* n_up, ConnView* view, size_t* start, unsigned* seen) noexcept {
  std::lock_guard lock(s->mu);
  if (!s->user_mode() || s->sleepers > 0) {
    kernel_current(*s);
    return false;
  }
  auto& words = t_words;  // one TLS lookup, not one per registration
  try {
    // Grown, never shrunk, and filled in place (a Snap built and copied
    // costs a store-forwarding stall per registration).
    if (snap->size() < s->ups.size()) snap->resize(s->ups.size());
    if (words.size() < s->ups.size()) words.resize(s->ups.size());
  } catch (...) {
    kernel_current(*s);
    return false;
  }
  // Published first, then each checked alive (conn_guard.hpp ConnView).
  for (size_t i = 0; i < s->ups.size(); ++i) words[i] = s->ups[i].word;
  if (!view->open(words.data(), s->ups.size())) {
    kernel_current(*s);
    return false;
  }
  const pid_t self = process_id();
  Snap* out = snap->data();
  size_t kept = 0;
  try {  // remove_reg may allocate (epoll_data counts)
    for (size_t i = 0; i < s->ups.size();) {
      Upgraded& u = s->ups[i];
      if (u.conn.expired()) {
        // Closed (its registration left the kernel set with it).
        remove_reg(*s, epfd, u.fd);
        continue;
      }
      // Alive after the view was published: allocated until view->close().
      Conn& c = *reinterpret_cast<Conn*>(u.word);  // NOLINT(performance-no-int-to-ptr)
      if (!engines->add(c, u.conn, self)) {        // a forked child's copy
        kernel_current(*s);
        return false;
      }
      if (!c.lazy.load(std::memory_order_relaxed) &&
          !c.eager.load(std::memory_order_relaxed)) {
        std::lock_guard clock(c.lazy_mu);
        if (!c.eager.load(std::memory_order_relaxed) && c.epoll_set == epfd) {
          set_lazy(c, true);
          s->lazy_any = true;
        }
      }
      if (u.in_user) {
        Snap& e = out[kept++];
        e.conn = &c;
        e.events = u.events;
        e.data = u.data;
      }
      ++i;
    }
  } catch (...) {
    kernel_current(*s);
    return false;
  }
  *n_up = kept;
  if (kept == 0) {
    kernel_current(*s);
    return false;
  }
  *start = s->next % kept;
  *seen = s->changes.load(std::memory_order_relaxed);
  return true;
}

}  // namespace

bool user_epoll_wait(int epfd, epoll_event* events, int max, int timeout,
                     int* result) noexcept {
  if (max <= 0 || !wait_may_spin()) return false;
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return false;
  EngineDrain engines;
  ConnView view;
  auto& snap = t_snap;
  size_t n_up = 0;
  size_t start = 0;
  unsigned seen = 0;
  if (!take_view(s, epfd, &engines, &snap, &n_up, &view, &start, &seen)) {
    view.close();
    return false;
  }
  const auto spin = set_spin(*s, timeout);
  const auto t0 = SpinClock::now();
  // Kernel answers for upgraded registrations are dropped: user space
  // answered for them (their data is theirs alone: no collisions).
  auto kernel = [&](epoll_event* out, int room) -> int {
    const int k = real().epoll_wait(epfd, out, room, 0);
    if (k <= 0) return k;
    std::lock_guard lock(s->mu);
    int kept = 0;
    for (int i = 0; i < k; ++i) {
      auto it = s->data_use.find(out[i].data.u64);
      if (it != s->data_use.end() && it->second.upgraded > 0) continue;
      out[kept++] = out[i];
    }
    return kept;
  };
  int r = 0;
  for (unsigned tries = 0;; ++tries) {
    engines.drain();
    if (s->changes.load(std::memory_order_acquire) != seen) {
      // Another thread added, changed or removed a registration: what this
      // view would report may be gone (its data freed). Take a new view; if
      // the set is no longer answered here, the caller's kernel path waits
      // (with the whole timeout: at most this spin longer).
      view.close();
      engines = EngineDrain{};
      if (!take_view(s, epfd, &engines, &snap, &n_up, &view, &start, &seen)) {
        view.close();
        return false;
      }
      continue;
    }
    // The kernel's turn: every kKernelEvery-th call, with room kept for it.
    const bool kernel_due =
        s->user_calls.fetch_add(1, std::memory_order_relaxed) + 1 >= kKernelEvery;
    int room = max;
    if (kernel_due && max > 1) room = max - 1;
    int n = 0;
    size_t i = 0;
    if (!(kernel_due && max == 1)) {
      const Snap* const view_snaps = snap.data();
      size_t at = start;  // (start + i) % n_up, without a division per entry
      for (; i < n_up && n < room; ++i) {
        const Snap& e = view_snaps[at];
        if (++at == n_up) at = 0;
        const uint32_t bits = epoll_bits(e.conn->stream->last_events(), e.events);
        if (bits == 0) continue;
        events[n].events = bits;
        events[n].data = e.data;
        ++n;
      }
    }
    if (n == 0 || kernel_due) {
      s->user_calls.store(0, std::memory_order_relaxed);
      const int k = kernel(events + n, max - n);
      if (k < 0 && n == 0) {
        r = -1;
        break;
      }
      if (k > 0) n += k;
    }
    if (n > 0) {
      // The next call starts after the last one reported: none starves.
      std::lock_guard lock(s->mu);
      s->next = (start + (i == 0 ? 1 : i)) % n_up;
      r = n;
      break;
    }
    if (SpinClock::now() - t0 >= spin) {
      r = 0;
      if (timeout == 0) break;
      // Sleep in the kernel: readiness sockets current, progress thread armed.
      {
        std::lock_guard lock(s->mu);
        ++s->sleepers;
        kernel_current(*s);
      }
      // The view lets go of the connections first: one that another thread
      // closes during the sleep ends at once (the kernel set holds no file).
      view.close();
      engines.before_sleep();
      const auto slept_from = SpinClock::now();
      r = real().epoll_wait(epfd, events, max, timeout_left(timeout, slept_from - t0));
      adapt_spin(*s, r, SpinClock::now() - slept_from);
      const int saved = errno;
      {
        std::lock_guard lock(s->mu);
        --s->sleepers;
      }
      errno = saved;
      break;
    }
    spin_pause(tries);
  }
  const int saved = errno;
  view.close();
  errno = saved;
  *result = r;
  return true;
}

}  // namespace rdmakit::preload
