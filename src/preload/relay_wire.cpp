#include "relay_wire.hpp"

#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fd_place.hpp"
#include "interruption.hpp"
#include "libc.hpp"

namespace rdmakit::preload::relay_wire {

sockaddr_un relay_address(pid_t pid, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  char name[48];
  const int n =
      std::snprintf(name, sizeof name, "rdmakit-relay-%d", static_cast<int>(pid));
  std::memcpy(sa.sun_path + 1, name, static_cast<size_t>(n));  // abstract: leading NUL
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

bool send_with_fds(int s, const void* buf, size_t len, const int* fds, int nfds) {
  iovec v{const_cast<void*>(buf), len};  // NOLINT: iovec is not const-correct
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  if (nfds > 0) {
    h.msg_control = ctl;
    h.msg_controllen = CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(static_cast<size_t>(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, static_cast<size_t>(nfds) * sizeof(int));
  }
  return real().sendmsg(s, &h, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

bool send_message(int s, const Message& m, const int* fds, int nfds) {
  return send_with_fds(s, &m, sizeof m, fds, nfds);
}

bool recv_with_fds(int s, void* buf, size_t len, int* fds, int max_fds, int wait_ms) {
  pollfd p{s, POLLIN, 0};
  const int r = poll_through_signals(&p, 1, wait_ms);
  if (r <= 0) return false;
  iovec v{buf, len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  const ssize_t n = real().recvmsg(s, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  for (int i = 0; i < max_fds; ++i) fds[i] = -1;
  if (n < 0) return false;
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (got < max_fds) {
        fds[got++] = place_high(fd);
      } else {
        real().close(fd);
      }
    }
  }
  return n == static_cast<ssize_t>(len) && (h.msg_flags & MSG_CTRUNC) == 0;
}

bool recv_message(int s, Message* m, int* fds, int max_fds, int wait_ms) {
  return recv_with_fds(s, m, sizeof *m, fds, max_fds, wait_ms) && m->magic == kMagic;
}

}  // namespace rdmakit::preload::relay_wire
