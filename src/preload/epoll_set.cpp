#include "epoll_set.hpp"

#include <sys/epoll.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <vector>

#include "epoll_registry.hpp"
#include "kernel_registrations.hpp"
#include "libc.hpp"
#include "process.hpp"

namespace rdmakit::preload {

namespace ep {

// One slot per descriptor number, never freed (a late hook may still look);
// untouched slots cost no memory.
std::atomic<EpSet*> g_sets[kMaxFd];

EpSet* set_of(int fd, bool create) {
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

void forget_sets_in_child() noexcept {
  for (auto& s : g_sets) s.store(nullptr, std::memory_order_relaxed);
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
  s.changes.fetch_add(1, std::memory_order_release);  // a spinning wait retakes its view
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
  if (ep::Reg* r = s.regs.find(u.fd)) r->data = data.u64;
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
    auto c = u.conn.lock();
    // The table's word, not find_conn: a number reused by an unsettled
    // connection must not be settled under the set's lock.
    if (!c || entry_of(u.fd) != Entry::kConn || entry_conn(u.fd) != c) {
      // Closed: its registration left the kernel set with it, and the number
      // may name another file now (never touched here).
      remove_reg(s, s.epfd, u.fd);
      continue;
    }
    if (!u.in_user) {
      if (u.in_kernel) (void)real().epoll_ctl(s.epfd, EPOLL_CTL_DEL, u.fd, nullptr);
      remove_reg(s, s.epfd, u.fd);  // moves the last entry to i
      continue;
    }
    if (!u.in_kernel || u.k_events != u.events || u.k_data != u.data.u64) {
      epoll_event ev{};
      ev.events = u.events;
      ev.data = u.data;
      const int r = real().epoll_ctl(s.epfd, u.in_kernel ? EPOLL_CTL_MOD : EPOLL_CTL_ADD,
                                     u.fd, &ev);
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
  Reg* reg = s.regs.find(fd);
  if (reg == nullptr) return;
  const int up = reg->up;
  if (up < 0) {
    s.use_data(reg->data, false, -1);
  } else {
    Upgraded& u = s.ups[static_cast<size_t>(up)];
    set_user(s, u, false, 0, {});
    set_kernel(s, u, false, 0, 0);
    if (auto c = u.conn.lock(); c && c->owner == process_id()) {
      std::lock_guard lock(c->lazy_mu);
      set_lazy(*c, false);
      if (c->epoll_set == epfd) c->epoll_set = -1;
    }
    if (static_cast<size_t>(up) + 1 != s.ups.size()) {
      u = std::move(s.ups.back());
      if (Reg* moved = s.regs.find(u.fd)) moved->up = up;
    }
    s.ups.pop_back();
    if (s.ups.empty()) {  // kernel data is not counted without upgraded ones
      s.data_use.clear();
      s.collisions = 0;
    }
  }
  s.regs.erase(fd);
}

void add_reg(EpSet& s, int epfd, int fd, const epoll_event& ev) {
  // An unsettled entry registered by the kernel socket (an early one,
  // early_send.hpp) stays unsettled: a kernel registration until it moves.
  auto c =
      is_conn(fd) && entry_of(fd) != Entry::kPending ? find_conn(fd, false) : nullptr;
  if (!c || c->owner != process_id()) {
    s.regs.set(fd, Reg{ev.data.u64, -1});
    s.use_data(ev.data.u64, false, 1);
    return;
  }
  if (s.ups.empty()) s.count_kernel_data();
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
  s.regs.set(fd, Reg{ev.data.u64, static_cast<int>(s.ups.size())});
  s.ups.push_back({fd, ev.events, ev.data, c, reinterpret_cast<uintptr_t>(c.get()), false,
                   false, 0, 0});
  Upgraded& u = s.ups.back();
  set_user(s, u, true, ev.events, ev.data);
  set_kernel(s, u, true, ev.events, ev.data.u64);
}

void mod_reg(EpSet& s, int fd, const epoll_event& ev) {
  Reg* reg = s.regs.find(fd);
  if (reg == nullptr) return;
  const int up = reg->up;
  if (up < 0) {
    s.use_data(reg->data, false, -1);
    s.use_data(ev.data.u64, false, 1);
    reg->data = ev.data.u64;
    return;
  }
  Upgraded& u = s.ups[static_cast<size_t>(up)];
  set_user(s, u, true, ev.events, ev.data);
  set_kernel(s, u, true, ev.events, ev.data.u64);
}

// The set's registrations as the kernel holds them. s.mu held. false when
// they cannot be read (the set then stays on the kernel path).
bool import_from_kernel(EpSet& s) {
  std::vector<HeldRegistration> held;
  if (!read_registrations(s.epfd, &held)) return false;
  for (const auto& h : held) {
    remove_reg(s, s.epfd, h.fd);
    add_reg(s, s.epfd, h.fd, h.ev);
  }
  return true;
}

}  // namespace ep

using ep::add_reg;
using ep::EpSet;
using ep::kernel_current;
using ep::kSpecial;
using ep::leave_lazy;
using ep::mod_reg;
using ep::Reg;
using ep::remove_reg;
using ep::set_lazy;
using ep::set_user;
using ep::Upgraded;

void forget_epoll_sets_in_child() noexcept { ep::forget_sets_in_child(); }

namespace {

// The set forgets every registration (s.mu held): its connections' readiness
// sockets current and unlinked from it. The sleepers count stays: a thread
// still in a kernel wait on the old set counts itself out later.
void reset_set(EpSet& s, int epfd) noexcept {
  leave_lazy(s);
  for (auto& u : s.ups) {
    auto c = u.conn.lock();
    if (!c || c->owner != process_id()) continue;
    std::lock_guard lock(c->lazy_mu);
    if (c->epoll_set == epfd) c->epoll_set = -1;
  }
  s.regs.clear();
  s.data_use.clear();
  s.ups.clear();
  s.changes.fetch_add(1, std::memory_order_release);
  s.kernel_stale = false;
  s.nested = false;
  s.special = s.collisions = 0;
  s.next = 0;
  s.user_calls.store(0, std::memory_order_relaxed);
}

// The kernel judges a set this process does not track: a connection added
// to it keeps its readiness socket current.
void added_to_kernel_set(int op, int fd) noexcept {
  if (op != EPOLL_CTL_ADD) return;
  if (auto c = find_conn(fd, false)) keep_readiness_current(*c);
}

}  // namespace

void epoll_created(int epfd) noexcept {
  EpSet* s = ep::set_of(epfd, true);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  reset_set(*s, epfd);
  s->epfd = epfd;
  s->tracked = true;
  s->imported = any_upgraded();
  s->owner = process_id();
}

void forget_epoll(int epfd) noexcept {
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  if (!s->tracked && s->ups.empty()) return;
  reset_set(*s, epfd);
  s->tracked = false;
}

void epoll_seen_by_kernel(int fd) noexcept {
  EpSet* s = ep::set_of(fd, false);
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

std::vector<int> epoll_sets_of_this_process() {
  std::vector<int> sets;
  for (int fd = 0; fd < kMaxFd; ++fd) {
    if (ep::set_of(fd, false) != nullptr && epoll_set_of_this_process(fd))
      sets.push_back(fd);
  }
  return sets;
}

bool epoll_set_of_this_process(int epfd) noexcept {
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return false;
  std::lock_guard lock(s->mu);
  return s->tracked && s->owner == process_id();
}

void epoll_registration_moved(int epfd, int fd, const epoll_event& ev) noexcept {
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return;
  std::lock_guard lock(s->mu);
  // Not imported yet: the kernel's set is read back, as it now stands, at
  // the set's next epoll_ctl.
  if (!s->tracked || !s->imported) return;
  try {
    remove_reg(*s, epfd, fd);
    add_reg(*s, epfd, fd, ev);
  } catch (...) {
    s->nested = true;  // out of memory: the kernel judges the set
  }
  if (!s->user_mode()) kernel_current(*s);
}

void track_epoll_ctl(int epfd, int op, int fd, const epoll_event* ev) noexcept {
  if (op == EPOLL_CTL_ADD) epoll_seen_by_kernel(fd);  // nested epoll
  if (fd_word(fd) < kConnWord) note_kernel_registration(epfd, op, ev, fd);
  // Before the first upgrade nothing is kept, so the fallback path pays one
  // load per call; a set's registrations are read back from the kernel at
  // its first epoll_ctl after the upgrade (import_from_kernel).
  if (!any_upgraded()) return;
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) {
    added_to_kernel_set(op, fd);  // a set created before this library was loaded
    return;
  }
  std::lock_guard lock(s->mu);
  if (!s->tracked) {
    added_to_kernel_set(op, fd);
    return;
  }
  try {
    if (!s->imported) {
      s->imported = true;
      // The kernel's set already holds this call's change: applying it
      // again below changes nothing.
      if (!ep::import_from_kernel(*s)) s->nested = true;  // the kernel judges
    }
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
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return false;
  // The connection fd names now, by its table word: only its identity is
  // needed (is it the registration's?), so an upgraded entry costs one load,
  // no lock and no reference count. Any other entry is settled first (its
  // first use), as find_conn does.
  uintptr_t now = fd_word(fd);
  std::shared_ptr<Conn> settled;
  // Taking a connection out of a set is no use of it (libuv does so just
  // before it closes a connection it handed to another process): the
  // registration of an unsettled one is the kernel's.
  if (now < kConnWord && op == EPOLL_CTL_DEL) return false;
  // Left unsettled by the hook (early_send.hpp): the kernel socket's.
  if (now < kConnWord && entry_of(fd) == Entry::kPending) return false;
  if (now < kConnWord) {
    settled = find_conn(fd, ev != nullptr && (ev->events & (EPOLLIN | EPOLLPRI)) != 0);
    now = reinterpret_cast<uintptr_t>(settled.get());
  }
  std::lock_guard lock(s->mu);
  const Reg* reg = s->regs.find(fd);
  const bool ours = now != 0 && wait_may_spin() && s->user_mode() && s->sleepers == 0 &&
                    reg != nullptr && reg->up >= 0;
  Upgraded* u = ours ? &s->ups[static_cast<size_t>(reg->up)] : nullptr;
  // Same address and the registration's connection still alive after the
  // word was read: the same connection (the word's was alive when read, and
  // two live objects never share an address).
  bool handled = u != nullptr && u->word == now && !u->conn.expired();
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
      // Out of the kernel's set now, while the number still names the file:
      // a close follows (libuv deletes, then closes), and if the library
      // keeps the readiness socket open (a parked or relayed connection) the
      // registration would outlive the number, reporting events no DEL can
      // remove.
      if (u->in_kernel) {
        (void)real().epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
        set_kernel(*s, *u, false, 0, 0);
      }
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
  EpSet* s = ep::set_of(epfd, false);
  if (s == nullptr) return false;
  std::lock_guard lock(s->mu);
  // One connection per engine is enough: stop once both are found, or after
  // the first 8 once one is (a set rarely mixes shm and remote streams), so
  // a large set does not cost a weak_ptr lock per registration per wait.
  bool any = false;
  size_t seen = 0;
  for (auto& u : s->ups) {
    any = d->add(u.conn.lock()) || any;
    if (d->full() || (any && ++seen >= 8)) break;
  }
  return any;
}

KernelEpollWait::KernelEpollWait(int epfd) noexcept {
  EpSet* s = ep::set_of(epfd, false);
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

}  // namespace rdmakit::preload
