#include "early_send.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "interruption.hpp"
#include "kernel_registrations.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rendezvous_wire.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

// The answerer: a thread that settles a connection with early bytes as soon
// as its server starts to take the offer up, so the server never waits for
// a client that wrote and then makes no call on the connection (a client
// writing its requests on many connections before it reads any).
struct Watched {
  int fd;
  // The offer's listening sockets, readable once the server connects (the
  // abstract one -1 when there is none).
  int usock;
  int other_usock;
  std::weak_ptr<Pending> p;
};

std::mutex g_mu;
std::vector<Watched> g_watched;  // under g_mu
int g_wake = -1;                 // eventfd: a new entry, or stop
pid_t g_answerer_pid = 0;        // the process whose thread it is
bool g_at_exit = false;          // stop_answerer registered (kept across fork)
std::atomic<bool> g_stop{false};
std::atomic<bool> g_running{false};

bool still_pending(const Watched& w) {
  const auto p = w.p.lock();
  return p && entry_of(w.fd) == Entry::kPending && pending_of(w.fd) == p;
}

bool same(const std::weak_ptr<Pending>& a, const std::weak_ptr<Pending>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

// Drops w's entry (g_mu taken here).
void unwatch(const Watched& w) {
  const std::lock_guard lock(g_mu);
  std::erase_if(g_watched,
                [&](const Watched& x) { return x.fd == w.fd && same(x.p, w.p); });
}

void answer_loop() {
  const InternalScope internal;
  std::vector<Watched> now;
  std::vector<pollfd> fds;
  // Everything but the wait runs under the fork guard (process.hpp).
  std::shared_lock settling(fork_guard());
  while (!g_stop.load(std::memory_order_acquire)) {
    {
      const std::lock_guard lock(g_mu);
      now = g_watched;
    }
    // Outside g_mu: the fd table's lock comes first (fork takes both).
    std::erase_if(now, [](const Watched& w) {
      if (still_pending(w)) return false;
      unwatch(w);
      return true;
    });
    fds.assign(1, pollfd{g_wake, POLLIN, 0});
    for (const auto& w : now) {
      fds.push_back({w.usock, POLLIN, 0});
      fds.push_back({w.other_usock, POLLIN, 0});  // -1: ignored by poll
    }
    // A second's tick prunes what the application settled or closed.
    settling.unlock();
    const int ready = real().poll(fds.data(), fds.size(), 1000);
    settling.lock();
    if (ready <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)real().read(g_wake, &n, sizeof n);
    }
    bool busy = false;
    for (size_t i = 0; i < now.size(); ++i) {
      if ((fds[2 * i + 1].revents | fds[2 * i + 2].revents) == 0) continue;
      // As the application's next use would, if fd still names it.
      if (const auto p = now[i].p.lock()) settle_if_pending(now[i].fd, p);
      // Still pending: another thread holds its settle lock (settling it,
      // or about to let go); looked at again in a moment.
      if (still_pending(now[i])) {
        busy = true;
        continue;
      }
      unwatch(now[i]);
    }
    if (busy) {
      settling.unlock();
      (void)poll_through_signals(nullptr, 0, 1);
      settling.lock();
    }
  }
  g_running.store(false, std::memory_order_release);
}

void stop_answerer() {
  if (g_answerer_pid != getpid()) return;
  g_stop.store(true, std::memory_order_release);
  const uint64_t one = 1;
  (void)real().write(g_wake, &one, sizeof one);
  for (int i = 0; i < 2000 && g_running.load(std::memory_order_acquire); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Caller holds g_mu. false: no thread (the connection is then settled by
// the application's next use, as without early bytes).
bool ensure_answerer() {
  if (g_answerer_pid == getpid() && g_running.load(std::memory_order_acquire))
    return true;
  if (g_wake < 0) g_wake = place_high(real().eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (g_wake < 0) return false;
  bool started = false;
  try {
    g_stop.store(false, std::memory_order_relaxed);
    g_running.store(true, std::memory_order_relaxed);
    rdmakit::detail::start_library_thread(answer_loop).detach();
    if (!g_at_exit) g_at_exit = std::atexit(stop_answerer) == 0;
    g_answerer_pid = getpid();
    started = true;
  } catch (...) {
    g_running.store(false, std::memory_order_relaxed);
  }
  return started;
}

}  // namespace

void watch_offer(int fd, const std::shared_ptr<Pending>& p) noexcept {
  if (!p->offer) return;  // settled meanwhile
  try {
    const std::lock_guard lock(g_mu);
    for (const auto& w : g_watched) {
      if (w.fd == fd && w.p.lock() == p) return;
    }
    if (!ensure_answerer()) return;  // the application's next use settles it
    g_watched.push_back({fd, p->offer->usock, p->offer->other_usock, p});
    const uint64_t one = 1;
    (void)real().write(g_wake, &one, sizeof one);
  } catch (...) {
    // Out of memory: the application's next use settles it.
  }
}

namespace {

// At most this many early bytes: written again on the stream at the
// upgrade, they must fit the peer's ring at once (a small --ring-kb).
size_t early_limit() {
  return std::min<size_t>(wire::kMaxEarlyBytes, config().shm_ring_bytes / 2);
}

// fd is a connect()ed same-host connection of this process alone, not
// settled, whose server has not started to take the offer up (waited for
// up to kFirstSendGrace while nothing went early yet), with room for
// `adding` more early bytes. Its Pending, with *lock holding its settle
// lock; null otherwise. May throw (std::bad_alloc).
std::shared_ptr<Pending> untaken_offer(int fd, size_t adding,
                                       std::unique_lock<std::mutex>* lock) {
  if (entry_of(fd) != Entry::kPending) return nullptr;
  auto p = pending_of(fd);
  if (!p || !p->offer) return nullptr;
  // A settle in progress (another thread): the caller waits for it.
  std::unique_lock held(p->mu, std::try_to_lock);
  if (!held.owns_lock() || pending_of(fd) != p || !p->offer) return nullptr;
  const PendingOffer& o = *p->offer;
  // Only this process holds it: a forked copy, an exec'd image or a
  // receiver would not know the bytes went ahead.
  if (o.remote || o.listener_here || o.usock < 0 || p->inherited.load() ||
      p->accepted_by != process_id() || p->fork_gen != fork_generation() ||
      p->sent_until_ns.load(std::memory_order_acquire) != 0 ||
      o.early.size() + adding > early_limit()) {
    return nullptr;
  }
  // Corked bytes may stay in the kernel until a later send: the count the
  // commit gives would not have arrived.
  int cork = 0;
  socklen_t cl = sizeof cork;
  if (real().getsockopt(fd, IPPROTO_TCP, TCP_CORK, &cork, &cl) != 0 || cork != 0) {
    return nullptr;
  }
  // The server has connected to the offer (it is taking it up now): the
  // upgrade is a moment away, so the caller settles first.
  pollfd pfd[2] = {{o.usock, POLLIN, 0}, {o.other_usock, POLLIN, 0}};
  const int grace = o.early.empty() ? static_cast<int>(kFirstSendGrace.count()) : 0;
  const int ready = poll_through_signals(pfd, 2, grace);  // a -1 entry is ignored
  if (ready != 0) return nullptr;
  *lock = std::move(held);
  return p;
}

}  // namespace

bool wait_to_send_in_kernel(int fd) noexcept {
  try {
    std::unique_lock<std::mutex> lock;
    return untaken_offer(fd, 0, &lock) != nullptr;
  } catch (...) {
    return false;
  }
}

EarlySend::EarlySend(int fd, const iovec* iov, int iovcnt) noexcept {
  try {
    if (iov == nullptr || iovcnt <= 0) return;
    size_t len = 0;
    for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
    if (len == 0) return;
    std::unique_lock<std::mutex> lock;
    auto p = untaken_offer(fd, len, &lock);
    if (!p) return;
    p->offer->early.reserve(wire::kMaxEarlyBytes);  // done() then never allocates
    p_ = std::move(p);
    lock_ = std::move(lock);
    fd_ = fd;
    iov_ = iov;
    iovcnt_ = iovcnt;
  } catch (...) {
    p_.reset();  // out of memory: the send settles first, as before
  }
}

EarlySend::~EarlySend() = default;

EarlyEpoll::EarlyEpoll(int epfd, int op, int fd, const epoll_event* ev) noexcept {
  try {
    if (entry_of(fd) != Entry::kPending) return;
    // One-shot and exclusive wake-ups live in the kernel's registration:
    // moving it could fire or lose one.
    const bool movable =
        ev != nullptr && (ev->events & (EPOLLONESHOT | EPOLLEXCLUSIVE)) == 0;
    std::unique_lock<std::mutex> lock;
    std::shared_ptr<Pending> p;
    if (op == EPOLL_CTL_ADD) {
      if (!movable || !epoll_set_of_this_process(epfd)) return;
      p = untaken_offer(fd, 0, &lock);
      if (!p) return;
    } else {
      // A settle in progress may be moving this registration: wait for it.
      p = pending_of(fd);
      if (!p || !p->offer) return;
      lock = std::unique_lock(p->mu);
      if (pending_of(fd) != p || entry_of(fd) != Entry::kPending || !p->offer) return;
    }
    p_ = std::move(p);
    lock_ = std::move(lock);
    op_ = op;
    fd_ = fd;
  } catch (...) {
    p_.reset();
  }
}

EarlyEpoll::~EarlyEpoll() = default;

int EarlyEpoll::done(int result) noexcept {
  if (p_ == nullptr || result != 0) return result;
  // An event loop's wait sleeps on the kernel socket: the answerer settles
  // the connection when its server takes the offer up, and the upgrade
  // moves this registration (kernel_registrations.hpp), so the wait sees
  // the stream.
  if (op_ == EPOLL_CTL_ADD) watch_offer(fd_, p_);
  return result;
}

void early_lock_for_fork() noexcept { g_mu.lock(); }
void early_unlock_after_fork() noexcept { g_mu.unlock(); }

void forget_answerer_in_child() noexcept {
  // The thread is the parent's; so are the entries and the wake eventfd.
  g_watched.clear();
  if (g_wake >= 0) real().close(g_wake);
  g_wake = -1;
  g_answerer_pid = 0;
  g_running.store(false, std::memory_order_relaxed);
  g_mu.unlock();
}

ssize_t EarlySend::done(ssize_t sent) noexcept {
  if (p_ == nullptr || sent <= 0) return sent;
  std::string& copy = p_->offer->early;
  if (copy.empty()) watch_offer(fd_, p_);
  auto left = static_cast<size_t>(sent);
  for (int i = 0; i < iovcnt_ && left > 0; ++i) {
    const size_t n = std::min(left, iov_[i].iov_len);
    copy.append(static_cast<const char*>(iov_[i].iov_base), n);
    left -= n;
  }
  return sent;
}

}  // namespace rdmakit::preload
