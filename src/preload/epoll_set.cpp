#include "epoll_set.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "libc.hpp"
#include "process.hpp"

namespace rdmakit::preload {

namespace {

// Registrations of upgraded connections with these flags keep the kernel
// path: their semantics live in the kernel's ready list.
constexpr uint32_t kSpecial = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

// An upgraded registration as the application sees it (user view: what
// epoll_ctl last asked) and as the kernel holds it. epoll_ctl on a user-mode
// set changes the user view only; the kernel's is brought level before any
// kernel wait on the set (sync_kernel).
struct Upgraded {
  int fd;
  uint32_t events;
  epoll_data_t data;
  std::weak_ptr<Conn> conn;
  bool in_user;
  bool in_kernel;
  uint32_t k_events;
  uint64_t k_data;
};

struct Reg {
  uint64_t data;
  int up;  // index in EpSet::ups; -1 for a kernel fd
};

struct DataUse {
  int kernel = 0;
  int upgraded = 0;
};

struct EpSet {
  std::mutex mu;
  int epfd = -1;
  bool tracked = false;  // created by the application in this process image
  pid_t owner = 0;
  bool nested = false;        // the kernel looks at the set itself
  int special = 0;            // upgraded registrations with kSpecial flags
  int collisions = 0;         // data values of both a kernel and an upgraded registration
  int sleepers = 0;           // threads in a kernel wait on the set
  bool lazy_any = false;      // some connection may have lazy readiness through this set
  bool kernel_stale = false;  // some upgraded registration's kernel view differs
  std::unordered_map<int, Reg> regs;
  std::unordered_map<uint64_t, DataUse> data_use;
  std::vector<Upgraded> ups;
  size_t next = 0;                      // where the next scan starts (round robin)
  std::atomic<unsigned> user_calls{0};  // calls answered from user space alone in a row
  // This set's spin before it sleeps (adaptive_spin); 0: the configured one.
  std::atomic<int64_t> spin_us{0};

  bool user_mode() const noexcept {
    return tracked && !nested && special == 0 && collisions == 0 && !ups.empty() &&
           owner == process_id();
  }
  void use_data(uint64_t d, bool upgraded, int delta) {
    DataUse& u = data_use[d];
    const bool was = u.kernel > 0 && u.upgraded > 0;
    (upgraded ? u.upgraded : u.kernel) += delta;
    const bool now = u.kernel > 0 && u.upgraded > 0;
    collisions += static_cast<int>(now) - static_cast<int>(was);
    if (u.kernel <= 0 && u.upgraded <= 0) data_use.erase(d);
  }
};

// One slot per descriptor number, never freed (a late hook may still look);
// untouched slots cost no memory.
std::atomic<EpSet*> g_sets[kMaxFd];

EpSet* get(int fd, bool create) {
  if (fd < 0 || fd >= kMaxFd) return nullptr;
  EpSet* s = g_sets[fd].load(std::memory_order_acquire);
  if (s != nullptr || !create) return s;
  auto* fresh = new (std::nothrow) EpSet();
  if (fresh == nullptr) return nullptr;
  if (!g_sets[fd].compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) {
    delete fresh;
    return s;
  }
  return fresh;
}

// c.lazy_mu held.
void set_lazy(Conn& c, bool on) noexcept {
  if (c.lazy.load(std::memory_order_relaxed) == on || !c.stream) return;
  c.stream->set_lazy_readiness(on);
  c.lazy.store(on, std::memory_order_relaxed);
}

// s.mu held: every connection of the set gets current readiness sockets.
void leave_lazy(EpSet& s) noexcept {
  if (!s.lazy_any) return;
  for (auto& u : s.ups) {
    auto c = u.conn.lock();
    if (!c || c->owner != process_id()) continue;
    std::lock_guard lock(c->lazy_mu);
    set_lazy(*c, false);
  }
  s.lazy_any = false;
}

// The user view of u becomes (in, events, data); s.mu held.
void set_user(EpSet& s, Upgraded& u, bool in, uint32_t events, epoll_data_t data) {
  if (u.in_user) {
    if ((u.events & kSpecial) != 0) --s.special;
    s.use_data(u.data.u64, true, -1);
  }
  u.in_user = in;
  if (!in) return;
  u.events = events;
  u.data = data;
  if ((events & kSpecial) != 0) ++s.special;
  s.use_data(data.u64, true, 1);
  s.regs[u.fd].data = data.u64;
}

// The kernel view of u; its data counts as upgraded too (kernel answers
// carrying it are dropped while it is registered). s.mu held.
void set_kernel(EpSet& s, Upgraded& u, bool in, uint32_t events, uint64_t data) {
  if (u.in_kernel) s.use_data(u.k_data, true, -1);
  u.in_kernel = in;
  if (!in) return;
  u.k_events = events;
  u.k_data = data;
  s.use_data(data, true, 1);
}

void remove_reg(EpSet& s, int epfd, int fd);

// The kernel's registrations of upgraded fds made level with the user
// view (the epoll_ctl calls user mode spared). s.mu held.
void sync_kernel(EpSet& s) noexcept {
  if (!s.kernel_stale) return;
  s.kernel_stale = false;
  for (size_t i = 0; i < s.ups.size();) {
    Upgraded& u = s.ups[i];
    if (!u.in_user) {
      if (u.in_kernel) (void)real().epoll_ctl(s.epfd, EPOLL_CTL_DEL, u.fd, nullptr);
      remove_reg(s, s.epfd, u.fd);  // moves the last entry to i
      continue;
    }
    if (!u.in_kernel || u.k_events != u.events || u.k_data != u.data.u64) {
      epoll_event ev{};
      ev.events = u.events;
      ev.data = u.data;
      int r = real().epoll_ctl(s.epfd, u.in_kernel ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, u.fd,
                               &ev);
      if (r != 0 && errno == ENOENT)
        r = real().epoll_ctl(s.epfd, EPOLL_CTL_ADD, u.fd, &ev);
      try {
        if (r == 0) set_kernel(s, u, true, u.events, u.data.u64);
      } catch (...) {
        s.kernel_stale = true;
      }
    }
    ++i;
  }
}

// Before the kernel looks at the set: registrations and readiness sockets
// current. s.mu held.
void kernel_current(EpSet& s) noexcept {
  // A forked child's copy: the registrations and connections are the parent's.
  if (s.owner != process_id()) return;
  const int saved = errno;
  sync_kernel(s);
  leave_lazy(s);
  errno = saved;
}

// s.mu held.
void remove_reg(EpSet& s, int epfd, int fd) {
  auto it = s.regs.find(fd);
  if (it == s.regs.end()) return;
  const int up = it->second.up;
  if (up < 0) {
    s.use_data(it->second.data, false, -1);
  } else {
    Upgraded& u = s.ups[static_cast<size_t>(up)];
    if (u.in_user) {
      if ((u.events & kSpecial) != 0) --s.special;
      s.use_data(u.data.u64, true, -1);
    }
    if (u.in_kernel) s.use_data(u.k_data, true, -1);
    if (auto c = u.conn.lock(); c && c->owner == process_id()) {
      std::lock_guard lock(c->lazy_mu);
      set_lazy(*c, false);
      if (c->epoll_set == epfd) c->epoll_set = -1;
    }
    if (static_cast<size_t>(up) + 1 != s.ups.size()) {
      u = std::move(s.ups.back());
      s.regs[u.fd].up = up;
    }
    s.ups.pop_back();
  }
  s.regs.erase(fd);
}

void add_reg(EpSet& s, int epfd, int fd, const epoll_event& ev) {
  auto c = is_conn(fd) ? find_conn(fd) : nullptr;
  if (!c || c->owner != process_id()) {
    s.regs[fd] = Reg{ev.data.u64, -1};
    s.use_data(ev.data.u64, false, 1);
    return;
  }
  {
    std::lock_guard lock(c->lazy_mu);
    if (c->epoll_set == -1) {
      c->epoll_set = epfd;
    } else if (c->epoll_set != epfd) {
      // In a second set: the kernel may look at its readiness socket there.
      c->eager.store(true, std::memory_order_release);
      set_lazy(*c, false);
    }
  }
  s.regs[fd] = Reg{ev.data.u64, static_cast<int>(s.ups.size())};
  s.ups.push_back({fd, ev.events, ev.data, c, false, false, 0, 0});
  Upgraded& u = s.ups.back();
  set_user(s, u, true, ev.events, ev.data);
  set_kernel(s, u, true, ev.events, ev.data.u64);
}

void mod_reg(EpSet& s, int fd, const epoll_event& ev) {
  auto it = s.regs.find(fd);
  if (it == s.regs.end()) return;
  const int up = it->second.up;
  if (up < 0) {
    s.use_data(it->second.data, false, -1);
    s.use_data(ev.data.u64, false, 1);
    it->second.data = ev.data.u64;
    return;
  }
  Upgraded& u = s.ups[static_cast<size_t>(up)];
  set_user(s, u, true, ev.events, ev.data);
  set_kernel(s, u, true, ev.events, ev.data.u64);
}

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
  if (timeout_ms >= 0 && static_cast<int64_t>(timeout_ms) * 1000 < us) us = timeout_ms * 1000LL;
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
// allocation per call once warm).
struct Snap {
  std::shared_ptr<Conn> conn;
  uint32_t events;
  epoll_data_t data;
};
thread_local std::vector<Snap> t_snap;

}  // namespace

void epoll_created(int epfd) noexcept {
  EpSet* s = get(epfd, true);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  leave_lazy(*s);
  s->regs.clear();
  s->data_use.clear();
  s->ups.clear();
  s->epfd = epfd;
  s->kernel_stale = false;
  s->tracked = true;
  s->owner = process_id();
  s->nested = false;
  s->special = s->collisions = s->sleepers = 0;
  s->next = 0;
  s->user_calls = 0;
}

void forget_epoll(int epfd) noexcept {
  EpSet* s = get(epfd, false);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  if (!s->tracked && s->ups.empty()) return;
  leave_lazy(*s);
  for (auto& u : s->ups) {
    auto c = u.conn.lock();
    if (!c || c->owner != process_id()) continue;
    std::lock_guard clock(c->lazy_mu);
    if (c->epoll_set == epfd) c->epoll_set = -1;
  }
  s->regs.clear();
  s->data_use.clear();
  s->ups.clear();
  s->tracked = false;
  s->special = s->collisions = 0;
}

void epoll_seen_by_kernel(int fd) noexcept {
  EpSet* s = get(fd, false);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  if (!s->tracked || s->nested) return;
  s->nested = true;
  kernel_current(*s);
}

void keep_readiness_current(Conn& c) noexcept {
  if (c.eager.load(std::memory_order_acquire) || c.owner != process_id()) return;
  std::lock_guard lock(c.lazy_mu);
  c.eager.store(true, std::memory_order_release);
  set_lazy(c, false);
}

void track_epoll_ctl(int epfd, int op, int fd, const epoll_event* ev) noexcept {
  if (op == EPOLL_CTL_ADD) epoll_seen_by_kernel(fd);  // nested epoll
  EpSet* s = get(epfd, false);
  if (s == nullptr) {
    // A set created before this library was loaded: the kernel judges it.
    if (op == EPOLL_CTL_ADD && is_conn(fd)) {
      if (auto c = find_conn(fd)) keep_readiness_current(*c);
    }
    return;
  }
  std::lock_guard lock(s->mu);
  if (!s->tracked) {
    if (op == EPOLL_CTL_ADD && is_conn(fd)) {
      if (auto c = find_conn(fd)) keep_readiness_current(*c);
    }
    return;
  }
  try {
    if (op == EPOLL_CTL_DEL) {
      remove_reg(*s, epfd, fd);
    } else if (ev != nullptr && op == EPOLL_CTL_ADD) {
      remove_reg(*s, epfd, fd);  // a number reused after a close the kernel saw
      add_reg(*s, epfd, fd, *ev);
    } else if (ev != nullptr && op == EPOLL_CTL_MOD) {
      mod_reg(*s, fd, *ev);
    }
  } catch (...) {
    // Out of memory: the set leaves user mode for good (the kernel judges).
    s->nested = true;
  }
  if (!s->user_mode()) kernel_current(*s);
}

bool user_epoll_ctl(int epfd, int op, int fd, const epoll_event* ev,
                    int* result) noexcept {
  if (!is_conn(fd)) return false;
  EpSet* s = get(epfd, false);
  if (s == nullptr) return false;
  auto c = find_conn(fd);
  std::lock_guard lock(s->mu);
  auto it = s->regs.find(fd);
  const bool ours = c && wait_may_spin() && s->user_mode() && s->sleepers == 0 &&
                    it != s->regs.end() && it->second.up >= 0;
  Upgraded* u = ours ? &s->ups[static_cast<size_t>(it->second.up)] : nullptr;
  bool handled = u != nullptr && u->conn.lock() == c;
  if (handled && op != EPOLL_CTL_DEL) {
    // What user mode cannot answer goes to the kernel: special flags, data
    // shared with a kernel registration, a missing event.
    handled = ev != nullptr && (ev->events & kSpecial) == 0;
    if (handled) {
      auto d = s->data_use.find(ev->data.u64);
      handled = d == s->data_use.end() || d->second.kernel == 0;
    }
  }
  if (!handled) {
    // The kernel's answer must be the user view's: registrations level first.
    kernel_current(*s);
    return false;
  }
  int r = 0;
  try {
    if (op == EPOLL_CTL_ADD && !u->in_user) {
      set_user(*s, *u, true, ev->events, ev->data);
    } else if (op == EPOLL_CTL_ADD) {
      r = EEXIST;
    } else if (op == EPOLL_CTL_MOD && u->in_user) {
      set_user(*s, *u, true, ev->events, ev->data);
    } else if (op == EPOLL_CTL_DEL && u->in_user) {
      set_user(*s, *u, false, 0, {});
    } else if (op == EPOLL_CTL_MOD || op == EPOLL_CTL_DEL) {
      r = ENOENT;
    } else {
      r = EINVAL;
    }
  } catch (...) {
    r = ENOMEM;
  }
  s->kernel_stale = true;
  if (r != 0) {
    errno = r;
    *result = -1;
  } else {
    *result = 0;
  }
  return true;
}

bool epoll_engines(int epfd, EngineDrain* d) noexcept {
  EpSet* s = get(epfd, false);
  if (s == nullptr) return false;
  std::lock_guard lock(s->mu);
  bool any = false;
  for (auto& u : s->ups) any = d->add(u.conn.lock()) || any;
  return any;
}

KernelEpollWait::KernelEpollWait(int epfd) noexcept {
  EpSet* s = get(epfd, false);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  if (!s->tracked) return;
  ++s->sleepers;
  kernel_current(*s);
  set_ = s;
}

KernelEpollWait::~KernelEpollWait() {
  if (set_ == nullptr) return;
  auto* s = static_cast<EpSet*>(set_);
  std::lock_guard lock(s->mu);
  --s->sleepers;
}

bool user_epoll_wait(int epfd, epoll_event* events, int max, int timeout,
                     int* result) noexcept {
  if (max <= 0 || !wait_may_spin()) return false;
  EpSet* s = get(epfd, false);
  if (s == nullptr) return false;
  EngineDrain engines;
  auto& snap = t_snap;
  snap.clear();
  size_t start = 0;
  {
    std::lock_guard lock(s->mu);
    if (!s->user_mode() || s->sleepers > 0) {
      kernel_current(*s);
      return false;
    }
    try {
      snap.reserve(s->ups.size());
      for (size_t i = 0; i < s->ups.size();) {
        Upgraded& u = s->ups[i];
        auto c = u.conn.lock();
        if (!c) {
          // Closed (its registration left the kernel set with it).
          remove_reg(*s, epfd, u.fd);
          continue;
        }
        if (!engines.add(c)) {  // a forked child's copy
          kernel_current(*s);
          return false;
        }
        if (!c->lazy.load(std::memory_order_relaxed) &&
            !c->eager.load(std::memory_order_relaxed)) {
          std::lock_guard clock(c->lazy_mu);
          if (!c->eager.load(std::memory_order_relaxed) && c->epoll_set == epfd) {
            set_lazy(*c, true);
            s->lazy_any = true;
          }
        }
        if (u.in_user) snap.push_back({std::move(c), u.events, u.data});
        ++i;
      }
    } catch (...) {
      kernel_current(*s);
      return false;
    }
    if (snap.empty()) {
      kernel_current(*s);
      return false;
    }
    start = s->next % snap.size();
  }
  const size_t n_up = snap.size();
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
    // The kernel's turn: every kKernelEvery-th call, with room kept for it.
    const bool kernel_due =
        s->user_calls.fetch_add(1, std::memory_order_relaxed) + 1 >= kKernelEvery;
    int room = max;
    if (kernel_due && max > 1) room = max - 1;
    int n = 0;
    size_t i = 0;
    if (!(kernel_due && max == 1)) {
      for (; i < n_up && n < room; ++i) {
        const Snap& e = snap[(start + i) % n_up];
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
      engines.before_sleep();
      int left = timeout;
      if (timeout > 0) {
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(SpinClock::now() - t0)
                .count();
        left = ms >= timeout ? 0 : timeout - static_cast<int>(ms);
      }
      const auto slept_from = SpinClock::now();
      r = real().epoll_wait(epfd, events, max, left);
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
  for (auto& e : snap) e.conn.reset();
  snap.clear();
  errno = saved;
  *result = r;
  return true;
}

}  // namespace rdmakit::preload
