#include "kernel_registrations.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "epoll_set.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

// Per fd number, the set that registered it and how (epoll_ctl's last ADD
// or MOD). epfd: 0 none, set + 1, kSeveral more than one set. A one-shot
// registration is moved as the kernel holds it (fired or not): `exact`.
constexpr int kSeveral = -1;
struct Noted {
  std::atomic<int> epfd{0};
  std::atomic<uint32_t> events{0};
  std::atomic<uint64_t> data{0};
  std::atomic<bool> exact{false};
};
Noted g_noted[kMaxFd];

bool read_all(int epfd, std::string* text) {
  char path[48];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epfd);
  const int fd = real().open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[65536];
  ssize_t n = 0;
  while ((n = real().read(fd, buf, sizeof buf)) > 0)
    text->append(buf, static_cast<size_t>(n));
  (void)real().close(fd);
  return n == 0;
}

// The registrations of `aliases` in epfd that name the kernel socket (inode
// ino), as the kernel holds them, taken off it.
void take_exact(int epfd, const std::vector<int>& aliases, ino_t ino,
                std::vector<KernelRegistration>* taken) {
  std::vector<HeldRegistration> held;
  if (!epoll_set_of_this_process(epfd) || !read_registrations(epfd, &held)) return;
  for (const auto& h : held) {
    if (h.ino != ino || std::find(aliases.begin(), aliases.end(), h.fd) == aliases.end())
      continue;
    if (real().epoll_ctl(epfd, EPOLL_CTL_DEL, h.fd, nullptr) == 0)
      taken->push_back({epfd, h.fd, h.ev});
  }
}

}  // namespace

bool read_registrations(int epfd, std::vector<HeldRegistration>* out) {
  std::string text;
  if (!read_all(epfd, &text)) return false;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    int tfd = -1;
    unsigned events = 0;
    unsigned long long data = 0;
    unsigned long long ino = 0;
    const int got =
        std::sscanf(line.c_str(), "tfd: %d events: %x data: %llx pos: %*d ino: %llx",
                    &tfd, &events, &data, &ino);
    if (got < 3) continue;
    if (tfd < 0 || tfd >= kMaxFd) return false;
    HeldRegistration r{};
    r.fd = tfd;
    r.ev.events = events;
    r.ev.data.u64 = data;
    r.ino = got == 4 ? static_cast<ino_t>(ino) : 0;
    out->push_back(r);
  }
  return true;
}

void note_kernel_registration(int epfd, int op, const epoll_event* ev, int fd) noexcept {
  if (fd < 0 || fd >= kMaxFd) return;
  Noted& n = g_noted[fd];
  const int want = epfd + 1;
  if (op == EPOLL_CTL_DEL) {
    int was = want;
    (void)n.epfd.compare_exchange_strong(was, 0, std::memory_order_acq_rel);
    return;
  }
  if (ev == nullptr) return;
  int was = n.epfd.load(std::memory_order_acquire);
  if (op == EPOLL_CTL_ADD && was != 0 && was != want) {
    n.epfd.store(kSeveral, std::memory_order_release);
    return;
  }
  if (was != want && op == EPOLL_CTL_MOD) return;  // another set's, or several
  n.events.store(ev->events, std::memory_order_relaxed);
  n.data.store(ev->data.u64, std::memory_order_relaxed);
  n.exact.store((ev->events & EPOLLONESHOT) != 0, std::memory_order_relaxed);
  n.epfd.store(want, std::memory_order_release);
}

void forget_kernel_registrations(int fd) noexcept {
  if (fd >= 0 && fd < kMaxFd) g_noted[fd].epfd.store(0, std::memory_order_release);
}

std::vector<KernelRegistration> take_kernel_registrations(const std::vector<int>& aliases,
                                                          ino_t kernel_ino) {
  std::vector<KernelRegistration> taken;
  std::vector<int> exact_sets;
  bool every_set = false;
  for (const int fd : aliases) {
    if (fd < 0 || fd >= kMaxFd) continue;
    const Noted& n = g_noted[fd];
    const int epfd = n.epfd.load(std::memory_order_acquire);
    if (epfd == kSeveral) {
      every_set = true;
    } else if (epfd > 0 && n.exact.load(std::memory_order_relaxed)) {
      exact_sets.push_back(epfd - 1);
    } else if (epfd > 0 && epoll_set_of_this_process(epfd - 1)) {
      // The kernel looks a registration up by the file the number names
      // now: a DEL that succeeds before the numbers change was the kernel
      // socket's.
      epoll_event ev{};
      ev.events = n.events.load(std::memory_order_relaxed);
      ev.data.u64 = n.data.load(std::memory_order_relaxed);
      if (real().epoll_ctl(epfd - 1, EPOLL_CTL_DEL, fd, nullptr) == 0)
        taken.push_back({epfd - 1, fd, ev});
    }
  }
  if (every_set) exact_sets = epoll_sets_of_this_process();
  std::sort(exact_sets.begin(), exact_sets.end());
  exact_sets.erase(std::unique(exact_sets.begin(), exact_sets.end()), exact_sets.end());
  for (const int epfd : exact_sets) take_exact(epfd, aliases, kernel_ino, &taken);
  return taken;
}

void put_back_registrations(const std::vector<KernelRegistration>& regs) noexcept {
  for (const auto& r : regs) {
    epoll_event ev = r.ev;
    if (real().epoll_ctl(r.epfd, EPOLL_CTL_ADD, r.fd, &ev) == 0) {
      epoll_registration_moved(r.epfd, r.fd, ev);
    } else {
      log_line(
          "fd=%d: its epoll registration in set %d could not be moved to the "
          "upgraded connection (%s)",
          r.fd, r.epfd, std::strerror(errno));
    }
  }
}

}  // namespace rdmakit::preload
