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

// Per fd number: 0 no set, epfd + 1 one set, kSeveral more than one.
constexpr int kSeveral = -1;
std::atomic<int> g_noted[kMaxFd];

bool read_all(int epfd, std::string* text) {
  char path[48];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", epfd);
  const int fd = real().open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = 0;
  while ((n = real().read(fd, buf, sizeof buf)) > 0)
    text->append(buf, static_cast<size_t>(n));
  (void)real().close(fd);
  return n == 0;
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

void note_kernel_registration(int epfd, int op, int fd) noexcept {
  if (fd < 0 || fd >= kMaxFd) return;
  auto& noted = g_noted[fd];
  if (op == EPOLL_CTL_ADD) {
    int was = noted.load(std::memory_order_relaxed);
    const int want = epfd + 1;
    while (was != want && was != kSeveral &&
           !noted.compare_exchange_weak(was, was == 0 ? want : kSeveral,
                                        std::memory_order_acq_rel)) {
    }
  } else if (op == EPOLL_CTL_DEL) {
    int was = epfd + 1;
    (void)noted.compare_exchange_strong(was, 0, std::memory_order_acq_rel);
  }
}

bool has_kernel_registration(int fd) noexcept {
  return fd >= 0 && fd < kMaxFd && g_noted[fd].load(std::memory_order_acquire) != 0;
}

bool has_kernel_registration(int epfd, int fd) noexcept {
  if (fd < 0 || fd >= kMaxFd) return false;
  const int noted = g_noted[fd].load(std::memory_order_acquire);
  return noted == epfd + 1 || noted == kSeveral;
}

std::vector<KernelRegistration> take_kernel_registrations(const std::vector<int>& aliases,
                                                          ino_t kernel_ino) {
  std::vector<int> sets;
  bool every_set = false;
  for (const int fd : aliases) {
    if (fd < 0 || fd >= kMaxFd) continue;
    const int noted = g_noted[fd].exchange(0, std::memory_order_acq_rel);
    if (noted == kSeveral) every_set = true;
    if (noted > 0) sets.push_back(noted - 1);
  }
  if (every_set) sets = epoll_sets_of_this_process();
  std::sort(sets.begin(), sets.end());
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  std::vector<KernelRegistration> taken;
  for (const int epfd : sets) {
    if (!epoll_set_of_this_process(epfd)) continue;
    std::vector<HeldRegistration> held;
    if (!read_registrations(epfd, &held)) continue;
    for (const auto& h : held) {
      if (h.ino != kernel_ino ||
          std::find(aliases.begin(), aliases.end(), h.fd) == aliases.end()) {
        continue;
      }
      if (real().epoll_ctl(epfd, EPOLL_CTL_DEL, h.fd, nullptr) == 0)
        taken.push_back({epfd, h.fd, h.ev});
    }
  }
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
