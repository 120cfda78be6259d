#include "epoll_set.hpp"

#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace rdmakit::preload {

namespace {

struct Entry {
  int fd;
  std::weak_ptr<Conn> conn;  // the connection the fd named when it was added
};

struct Sets {
  std::mutex mu;
  std::unordered_map<int, std::vector<Entry>> by_epfd;
  // Lock-free test for epoll_wait: does epfd watch any upgraded fd?
  std::atomic<uint8_t> has[kMaxFd];
};

// Never destroyed: a late hook (atexit, another thread) may still look.
Sets& sets() {
  static Sets* s = new Sets();
  return *s;
}

}  // namespace

void track_epoll_ctl(int epfd, int op, int fd) noexcept {
  // Nothing to track before the first upgrade (a preloaded program that
  // never upgrades allocates nothing here).
  if (epfd < 0 || epfd >= kMaxFd || op == EPOLL_CTL_MOD || !any_upgraded()) return;
  Sets& s = sets();
  if (op == EPOLL_CTL_ADD) {
    auto c = find_conn(fd);
    if (!c) return;
    std::lock_guard lock(s.mu);
    try {
      s.by_epfd[epfd].push_back({fd, c});
    } catch (...) {
      return;  // only the spin is lost: the kernel still reports the fd
    }
    s.has[epfd].store(1, std::memory_order_release);
    return;
  }
  if (op == EPOLL_CTL_DEL && s.has[epfd].load(std::memory_order_acquire) != 0) {
    std::lock_guard lock(s.mu);
    auto it = s.by_epfd.find(epfd);
    if (it == s.by_epfd.end()) return;
    auto& v = it->second;
    v.erase(
        std::remove_if(v.begin(), v.end(), [fd](const Entry& e) { return e.fd == fd; }),
        v.end());
    if (v.empty()) {
      s.by_epfd.erase(it);
      s.has[epfd].store(0, std::memory_order_release);
    }
  }
}

void forget_epoll(int epfd) noexcept {
  if (epfd < 0 || epfd >= kMaxFd || !any_upgraded()) return;
  Sets& s = sets();
  if (s.has[epfd].load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(s.mu);
  s.by_epfd.erase(epfd);
  s.has[epfd].store(0, std::memory_order_release);
}

bool epoll_engines(int epfd, EngineDrain* d) noexcept {
  if (epfd < 0 || epfd >= kMaxFd) return false;
  Sets& s = sets();
  if (s.has[epfd].load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(s.mu);
  auto it = s.by_epfd.find(epfd);
  if (it == s.by_epfd.end()) return false;
  auto& v = it->second;
  // Closed connections (their fd left the kernel set with them) are dropped
  // here; at most one per engine is needed.
  bool any = false;
  for (size_t i = 0; i < v.size();) {
    auto c = v[i].conn.lock();
    if (!c) {
      v[i] = std::move(v.back());
      v.pop_back();
      continue;
    }
    any = d->add(std::move(c)) || any;
    ++i;
    if (any && !d->empty() && i >= 8) break;  // both engines rarely: enough
  }
  if (v.empty()) {
    s.by_epfd.erase(it);
    s.has[epfd].store(0, std::memory_order_release);
  }
  return any;
}

}  // namespace rdmakit::preload
