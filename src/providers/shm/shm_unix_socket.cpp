#include "providers/shm/shm_unix_socket.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace rdmakit::shm {
namespace {
ssize_t recv_once(int sock, void* buf, size_t len, std::span<Fd> fds, size_t* nfds);
}  // namespace

std::string abstract_name(uint16_t port) {
  return std::string(1, '\0') + "rdmakit-shm:" + std::to_string(port);
}

ssize_t recv_with_fds(int sock, void* buf, size_t len, std::span<Fd> fds, size_t* nfds,
                      std::chrono::milliseconds timeout) {
  *nfds = 0;
  // The peer may hold this socket's end too and take what poll() saw:
  // never block in recvmsg, look again until the time is up.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd pfd{sock, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int ready =
        ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready < 0 && errno != EINTR) return -errno;
    if (ready == 0) return -ETIMEDOUT;
    if (ready < 0) continue;
    const ssize_t got = recv_once(sock, buf, len, fds, nfds);
    if (got != -EAGAIN) return got;
  }
}

namespace {

ssize_t recv_once(int sock, void* buf, size_t len, std::span<Fd> fds, size_t* nfds) {
  constexpr size_t kMaxFds = 8;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{buf, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got;
  do {
    got = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return -errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const auto* received = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, received + i, sizeof fd);
      if (*nfds < fds.size()) {
        fds[(*nfds)++].reset(fd);
      } else {
        ::close(fd);  // more than expected: never leak
      }
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return -EPROTO;
  return got;
}

}  // namespace

int send_with_fds(int sock, const void* buf, size_t len, std::span<const int> fds,
                  bool dont_wait) {
  constexpr size_t kMaxFds = 8;
  if (fds.size() > kMaxFds) return -EINVAL;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  iovec iov{const_cast<void*>(buf), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL | (dont_wait ? MSG_DONTWAIT : 0));
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return -errno;
  return sent == static_cast<ssize_t>(len) ? 0 : -EMSGSIZE;
}

Fd create_sealed_memfd(const char* name, size_t bytes) {
  Fd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return fd;
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

Fd create_resizable_sealed_memfd(const char* name, size_t bytes) {
  Fd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return fd;
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

bool finish_seals(int fd, bool read_only_for_peers) {
  return ::fcntl(fd, F_ADD_SEALS,
                 F_SEAL_SEAL | (read_only_for_peers ? F_SEAL_FUTURE_WRITE : 0)) == 0;
}

bool is_socket(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

bool peer_cred(int sock, PeerCred* cred) {
  ucred c{};
  socklen_t len = sizeof c;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0) return false;
  cred->pid = c.pid;
  cred->uid = c.uid;
  cred->gid = c.gid;
  return true;
}

bool sealed_and_sized(int fd, size_t bytes) {
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & F_SEAL_SHRINK) != 0 && ::fstat(fd, &st) == 0 &&
         st.st_size >= 0 && static_cast<size_t>(st.st_size) >= bytes;
}

void* map_fd(int fd, size_t length, bool writable, bool populate) {
  const bool whole = populate && length <= kPopulateBytes;
  void* p = ::mmap(nullptr, length, PROT_READ | (writable ? PROT_WRITE : 0),
                   MAP_SHARED | (whole ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) return nullptr;
  if (populate && !whole) {
    // Best effort (kernel >= 5.14); without it the prefix faults on first touch.
    (void)::madvise(p, kPopulatePrefix,
                    writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  }
  return p;
}

}  // namespace rdmakit::shm
