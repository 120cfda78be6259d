// The intercepted libc functions (exported, C ABI). Each first asks the
// lock-free fd table whether fd is an upgraded connection; if not, the call
// goes straight to libc (async-signal-safe, nothing allocated or locked).
// No exception leaves this file: the control path catches everything and
// falls back to the kernel socket.
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include "adopt.hpp"
#include "conn_io.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "remote.hpp"
#include "rendezvous.hpp"
#include "rules.hpp"
#include "stat.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

bool tcp_stream_socket(int fd) {
  int type = 0;
  int proto = 0;
  socklen_t l = sizeof type;
  if (real().getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM) {
    return false;
  }
  l = sizeof proto;
  return real().getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 &&
         proto == IPPROTO_TCP;
}

bool inet(const sockaddr* sa) {
  return sa != nullptr && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6);
}

// A new kernel fd with this number: whatever the table held for it was
// closed behind our back (fclose, a raw syscall) and is stale.
void forget_stale(int fd) {
  (void)remove_conn(fd);
  if (is_listener(fd)) remove_listener(fd);
  forget_epoll(fd);
  stats::forget_fd(fd);
}

uint16_t port_of(const sockaddr* sa) {
  return ntohs(sa->sa_family == AF_INET
                   ? reinterpret_cast<const sockaddr_in*>(sa)->sin_port      // NOLINT
                   : reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);  // NOLINT
}

// Whether this process may upgrade anything ("" yes); bad rule variables
// are reported once.
const std::string& process_rules() {
  static bool reported = false;
  if (!reported) {
    reported = true;
    if (!rule_errors().empty()) log_line("config: %s", rule_errors().c_str());
  }
  return process_denied();
}

void finish_upgrade(PendingOfferPtr offer, int fd) {
  const std::string where = describe(fd);
  Upgrade up = finish_connect(std::move(offer), fd);
  if (up.stream == nullptr) {
    log_line("connect fd=%d %s path=kernel reason=%s", fd, where.c_str(),
             up.reason.c_str());
    publish_fallback(fd, "connect", up.reason);
    return;
  }
  (void)adopt(fd, {fd}, up, "connect", where);
}

ssize_t recv_one(int fd, void* buf, size_t len, int flags) {
  auto c = find_conn(fd);
  if (!c) return real().recv(fd, buf, len, flags);
  iovec v{buf, len};
  return conn_recv(*c, fd, &v, 1, flags);
}

ssize_t send_one(int fd, const void* buf, size_t len, int flags) {
  auto c = find_conn(fd);
  if (!c) return real().send(fd, buf, len, flags);
  iovec v{const_cast<void*>(buf), len};  // NOLINT: iovec is not const-correct
  return conn_send(*c, fd, &v, 1, flags);
}

// A relayed connection (relay.hpp): its I/O and timeouts are the relay
// socket's, its names and every other option the kernel TCP socket's.
bool relay_side(int level, int name) {
  return level == SOL_SOCKET &&
         (name == SO_ERROR || name == SO_RCVTIMEO || name == SO_SNDTIMEO);
}

int relayed_getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  return real().getsockopt(relay_side(level, name) ? fd : kernel_socket(fd), level, name,
                           val, len);
}

int relayed_setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (relay_side(level, name)) (void)real().setsockopt(fd, level, name, val, len);
  return real().setsockopt(kernel_socket(fd), level, name, val, len);
}

// recvfrom on a connected TCP socket: the kernel reports no source
// address (the length set to 0, the address left untouched).
void no_source_address(sockaddr* addr, socklen_t* len) {
  if (addr != nullptr && len != nullptr) *len = 0;
}

}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

#define CALLER __builtin_return_address(0)

EXPORT int socket(int domain, int type, int protocol) {
  int fd = real().socket(domain, type, protocol);
  if (fd >= 0 && internal_caller(CALLER)) fd = place_high(fd);
  if (fd >= 0) forget_stale(fd);
  return fd;
}

EXPORT int connect(int fd, const sockaddr* addr, socklen_t len) {
  // A connection already made (a second connect() asks whether a
  // non-blocking one is done, as hiredis does): the kernel socket answers.
  if (entry_of(fd) != Entry::kNone && entry_of(fd) != Entry::kListener) {
    return real().connect(kernel_socket(fd), addr, len);
  }
  // rdmakit's own connections (the tcp provider) are not candidates.
  if (!inet(addr) || fd >= kMaxFd || internal_caller(CALLER) || !tcp_stream_socket(fd)) {
    return real().connect(fd, addr, len);
  }
  std::string reason = process_rules();
  if (reason.empty()) reason = connection_denied(port_of(addr), addr);
  PendingOfferPtr offer;
  if (reason.empty()) offer = prepare_connect(fd, addr, &reason);
  if (!offer) {
    const int r = real().connect(fd, addr, len);
    if (r == 0 || errno == EINPROGRESS) {
      const int saved = errno;
      log_line("connect fd=%d peer=%s path=kernel reason=%s", fd, endpoint(addr).c_str(),
               reason.c_str());
      publish_fallback(fd, "connect", reason, addr);
      errno = saved;
    }
    return r;
  }
  const int r = real().connect(fd, addr, len);
  if (r != 0 && errno != EINPROGRESS) return r;
  // Same host: the rendezvous finishes at the connection's first use
  // (handoff.hpp), so this call returns as the kernel's did.
  if (const int saved = errno; !offer_is_remote(*offer) && defer_connect(fd, offer)) {
    errno = saved;
    return r;
  }
  if (r == 0) {
    finish_upgrade(std::move(offer), fd);
    return 0;
  }
  // Non-blocking connect: the upgrade must finish before the application
  // can register the fd with epoll, so wait (bounded) for the kernel
  // connect; if it takes longer the connection stays on kernel TCP.
  const int saved = errno;
  pollfd p{fd, POLLOUT, 0};
  const int pr = poll(&p, 1, static_cast<int>(config().timeout.count()));
  if (pr <= 0) {
    log_line(
        "connect fd=%d peer=%s path=kernel reason=non-blocking connect still in progress",
        fd, endpoint(addr).c_str());
    publish_fallback(fd, "connect", "non-blocking connect still in progress", addr);
    errno = saved;
    return -1;
  }
  int err = 0;
  socklen_t el = sizeof err;
  (void)real().getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
  if (err != 0) {
    errno = err;
    return -1;
  }
  finish_upgrade(std::move(offer), fd);
  return 0;
}

EXPORT int listen(int fd, int backlog) {
  const int r = real().listen(fd, backlog);
  if (r == 0 && fd < kMaxFd && !internal_caller(CALLER) && process_rules().empty() &&
      tcp_stream_socket(fd)) {
    sockaddr_storage ss{};
    socklen_t l = sizeof ss;
    const auto* sa = reinterpret_cast<sockaddr*>(&ss);  // NOLINT
    // A port the rules deny is not registered: clients do not offer.
    if (real().getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0 &&  // NOLINT
        inet(sa) && connection_denied(port_of(sa), nullptr).empty()) {
      const uint16_t port = port_of(sa);
      add_listener(fd, port);
      register_listener(port);
      open_remote_listener(fd, port);
    }
  }
  return r;
}

namespace {
int accept_hook(int fd, sockaddr* addr, socklen_t* len, int flags, const void* caller) {
  if (internal_caller(caller)) {  // rdmakit's own (shm handshake)
    const int s = place_high(real().accept4(fd, addr, len, flags));
    if (s >= 0) forget_stale(s);
    return s;
  }
  const int s = real().accept4(fd, addr, len, flags);
  if (s < 0) return s;
  forget_stale(s);
  // Every accepted TCP connection looks for an offer, not only those of
  // listeners registered here: a listener inherited across exec (nginx
  // binary upgrade) is not in the table, but its port may still be
  // registered, and its clients are waiting.
  if (s >= kMaxFd || !tcp_stream_socket(s)) return s;
  const int saved = errno;
  // Same host: decided at the connection's first use, in whichever process
  // makes it (handoff.hpp).
  if (defer_accepted(s)) {
    errno = saved;
    return s;
  }
  const std::string where = describe(s);
  std::string deny = process_rules();
  if (deny.empty()) {
    sockaddr_storage local{};
    sockaddr_storage peer{};
    socklen_t ll = sizeof local;
    socklen_t pl = sizeof peer;
    if (real().getsockname(s, reinterpret_cast<sockaddr*>(&local), &ll) == 0 &&  // NOLINT
        real().getpeername(s, reinterpret_cast<sockaddr*>(&peer), &pl) == 0) {   // NOLINT
      deny = connection_denied(port_of(reinterpret_cast<sockaddr*>(&local)),     // NOLINT
                               reinterpret_cast<sockaddr*>(&peer));              // NOLINT
    }
  }
  Upgrade up = upgrade_accepted(s, deny);
  if (up.stream == nullptr) {
    log_line("accept fd=%d %s path=kernel reason=%s", s, where.c_str(),
             up.reason.c_str());
    publish_fallback(s, "accept", up.reason);
  } else {
    (void)adopt(s, {s}, up, "accept", where);
  }
  errno = saved;
  return s;
}
}  // namespace

EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return accept_hook(fd, addr, len, flags, CALLER);
}

EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) {
  return accept_hook(fd, addr, len, 0, CALLER);
}

EXPORT int close(int fd) {
  settle_before_close(fd);
  if (is_conn(fd) || entry_of(fd) == Entry::kRelayed) {
    auto c = remove_conn(fd);
    if (c && !c->stream && c.use_count() == 1) give_back(*c);  // its last relayed copy
    const int r = real().close(fd);
    // Last alias: the stream closes (queued data still delivered), unless
    // another process still holds the connection (relay.hpp).
    release_conn(std::move(c));
    return r;
  }
  if (is_listener(fd)) remove_listener(fd);
  forget_epoll(fd);
  stats::forget_fd(fd);
  return real().close(fd);
}

EXPORT int close_range(unsigned first, unsigned last, int flags) {
  if ((flags & CLOSE_RANGE_CLOEXEC) == 0) {
    const unsigned end = last < static_cast<unsigned>(kMaxFd) ? last : kMaxFd - 1;
    for (unsigned fd = first; fd <= end && fd < static_cast<unsigned>(kMaxFd); ++fd) {
      forget_stale(static_cast<int>(fd));
    }
  }
  return real().close_range(first, last, flags);
}

EXPORT int shutdown(int fd, int how) {
  auto c = find_conn(fd);
  if (!c) return real().shutdown(fd, how);
  const int r = c->stream->shutdown(how);
  if (r < 0) {
    errno = -r;
    return -1;
  }
  return 0;
}

// read and write fall through to read and write themselves (not recv and
// send): a sandboxed process (sshd's seccomp filter) may allow only those.
EXPORT ssize_t read(int fd, void* buf, size_t len) {
  if (!is_conn(fd)) return real().read(fd, buf, len);
  auto c = find_conn(fd);
  if (!c) return real().read(fd, buf, len);
  iovec v{buf, len};
  return conn_recv(*c, fd, &v, 1, 0);
}

EXPORT ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (!is_conn(fd)) return real().read_chk(fd, buf, len, buflen);
  auto c = find_conn(fd);
  if (!c) return real().read_chk(fd, buf, len, buflen);
  iovec v{buf, len < buflen ? len : buflen};
  return conn_recv(*c, fd, &v, 1, 0);
}

EXPORT ssize_t write(int fd, const void* buf, size_t len) {
  if (!is_conn(fd)) return real().write(fd, buf, len);
  auto c = find_conn(fd);
  if (!c) return real().write(fd, buf, len);
  iovec v{const_cast<void*>(buf), len};  // NOLINT: iovec is not const-correct
  return conn_send(*c, fd, &v, 1, 0);
}

EXPORT ssize_t readv(int fd, const iovec* iov, int n) {
  if (!is_conn(fd)) return real().readv(fd, iov, n);
  auto c = find_conn(fd);
  if (!c) return real().readv(fd, iov, n);
  return conn_recv(*c, fd, iov, n, 0);
}

EXPORT ssize_t writev(int fd, const iovec* iov, int n) {
  if (!is_conn(fd)) return real().writev(fd, iov, n);
  auto c = find_conn(fd);
  if (!c) return real().writev(fd, iov, n);
  return conn_send(*c, fd, iov, n, 0);
}

EXPORT ssize_t recv(int fd, void* buf, size_t len, int flags) {
  if (!is_conn(fd)) return real().recv(fd, buf, len, flags);
  return recv_one(fd, buf, len, flags);
}

EXPORT ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  if (!is_conn(fd)) return real().recv_chk(fd, buf, len, buflen, flags);
  return recv_one(fd, buf, len < buflen ? len : buflen, flags);
}

EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  if (!is_conn(fd)) return real().send(fd, buf, len, flags);
  return send_one(fd, buf, len, flags);
}

EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* addr,
                        socklen_t* alen) {
  if (!is_conn(fd)) return real().recvfrom(fd, buf, len, flags, addr, alen);
  auto c = find_conn(fd);
  if (!c) return real().recvfrom(fd, buf, len, flags, addr, alen);
  iovec v{buf, len};
  const ssize_t r = conn_recv(*c, fd, &v, 1, flags);
  if (r >= 0) no_source_address(addr, alen);
  return r;
}

EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags,
                              sockaddr* addr, socklen_t* alen) {
  if (!is_conn(fd)) return real().recvfrom_chk(fd, buf, len, buflen, flags, addr, alen);
  return recvfrom(fd, buf, len < buflen ? len : buflen, flags, addr, alen);
}

EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags,
                      const sockaddr* addr, socklen_t alen) {
  if (!is_conn(fd)) return real().sendto(fd, buf, len, flags, addr, alen);
  return send_one(fd, buf, len, flags);  // connected: the address is ignored, as TCP does
}

namespace {
// Descriptors rdmakit receives (shm regions) go to the high range too.
void place_passed_fds(msghdr* msg) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    auto* fds = reinterpret_cast<int*>(CMSG_DATA(c));  // NOLINT
    for (size_t i = 0; i < n; ++i) {
      int v = 0;
      std::memcpy(&v, fds + i, sizeof v);
      v = place_high(v);
      std::memcpy(fds + i, &v, sizeof v);
    }
  }
}
}  // namespace

EXPORT ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  if (!is_conn(fd)) {
    const ssize_t r = real().recvmsg(fd, msg, flags);
    if (r >= 0 && msg->msg_controllen > 0) {
      if (internal_caller(CALLER)) {
        place_passed_fds(msg);
      } else {
        note_received(msg);  // a connection handed over by another process
      }
    }
    return r;
  }
  auto c = find_conn(fd);
  if (!c) return real().recvmsg(fd, msg, flags);
  const ssize_t r =
      conn_recv(*c, fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  if (r >= 0) stream_recvmsg_fields(*msg);
  return r;
}

EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  if (msg != nullptr && msg->msg_controllen > 0 && !internal_caller(CALLER)) {
    note_sent(msg);  // connections handed to another process stay shared
  }
  if (!is_conn(fd)) return real().sendmsg(fd, msg, flags);
  auto c = find_conn(fd);
  if (!c) return real().sendmsg(fd, msg, flags);
  return conn_send(*c, fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

namespace {
int fcntl_hook(int (*libc_fcntl)(int, int, ...), int fd, int cmd, void* arg,
               const void* caller) {
  if (!is_conn(fd)) {
    int r = libc_fcntl(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && internal_caller(caller)) {
      r = place_high(r);
    }
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) {
      forget_stale(r);
      epoll_seen_by_kernel(fd);  // an epoll set now also answers under another number
    }
    return r;
  }
  auto c = meta_conn(fd);
  if (!c) {
    const int r = libc_fcntl(fd, cmd, arg);
    if (r >= 0 && r < kMaxFd && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
      copy_entry(fd, r);
    return r;
  }
  const auto iarg = static_cast<int>(reinterpret_cast<intptr_t>(arg));  // NOLINT
  switch (cmd) {
    case F_GETFL: {
      const int r = libc_fcntl(fd, F_GETFL);
      if (r < 0) return r;
      return (r & ~O_NONBLOCK) | (c->nonblocking ? O_NONBLOCK : 0);
    }
    case F_SETFL:
      c->nonblocking = (iarg & O_NONBLOCK) != 0;
      // The readiness socket itself always stays non-blocking.
      return libc_fcntl(fd, F_SETFL, iarg | O_NONBLOCK);
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
      const int r = libc_fcntl(fd, cmd, iarg);
      if (r >= 0 && r < kMaxFd) install_conn(r, c);
      return r;
    }
    default: return libc_fcntl(fd, cmd, arg);
  }
}

}  // namespace

EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);  // every fcntl argument fits (int, long or pointer)
  va_end(ap);
  return fcntl_hook(real().fcntl, fd, cmd, arg, CALLER);
}

EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return fcntl_hook(real().fcntl64, fd, cmd, arg, CALLER);
}

EXPORT int ioctl(int fd, unsigned long req,
                 ...) {  // NOLINT(google-runtime-int): libc's type
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (!is_conn(fd)) return real().ioctl(fd, req, arg);
  // FIONREAD and the like are a use; FIONBIO only sets a flag.
  auto c = req == FIONBIO ? meta_conn(fd) : find_conn(fd);
  if (!c) return real().ioctl(fd, req, arg);
  switch (req) {
    case FIONBIO:
      if (arg == nullptr) break;
      c->nonblocking = *static_cast<int*>(arg) != 0;
      return 0;
    case FIONREAD:
      if (arg == nullptr) break;
      *static_cast<int*>(arg) = static_cast<int>(c->stream->available());
      return 0;
    case SIOCOUTQ:
      if (arg == nullptr) break;
      *static_cast<int*>(arg) = 0;
      return 0;
    default: return real().ioctl(c->tcp_fd, req, arg);
  }
  errno = EFAULT;
  return -1;
}

EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  if (entry_of(fd) == Entry::kRelayed)
    return relayed_getsockopt(fd, level, name, val, len);
  if (!is_conn(fd)) return real().getsockopt(fd, level, name, val, len);
  auto c = meta_conn(fd);
  if (!c) return real().getsockopt(kernel_socket(fd), level, name, val, len);
  if (level == SOL_SOCKET && name == SO_ERROR && val != nullptr && len != nullptr &&
      *len >= sizeof(int)) {
    *static_cast<int*>(val) =
        take_stream_error(*c);  // cleared by reading, as the kernel's
    *len = sizeof(int);
    return 0;
  }
  return real().getsockopt(c->tcp_fd, level, name, val, len);
}

EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (entry_of(fd) == Entry::kRelayed)
    return relayed_setsockopt(fd, level, name, val, len);
  if (!is_conn(fd)) return real().setsockopt(fd, level, name, val, len);
  auto c = meta_conn(fd);
  if (!c) return real().setsockopt(kernel_socket(fd), level, name, val, len);
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) &&
      val != nullptr && len >= sizeof(timeval)) {
    const auto* tv = static_cast<const timeval*>(val);
    const int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec;
    (name == SO_RCVTIMEO ? c->rcv_timeout_us : c->snd_timeout_us) = us;
  }
  // Stored by the kernel socket, so getsockopt answers as the kernel would.
  return real().setsockopt(c->tcp_fd, level, name, val, len);
}

EXPORT int getsockname(int fd, sockaddr* addr, socklen_t* len) {
  return real().getsockname(kernel_socket(fd), addr, len);
}

EXPORT int getpeername(int fd, sockaddr* addr, socklen_t* len) {
  return real().getpeername(kernel_socket(fd), addr, len);
}

EXPORT int dup(int fd) {
  const int r = real().dup(fd);
  if (r < 0) return r;
  forget_stale(r);
  epoll_seen_by_kernel(fd);  // an epoll set now also answers under another number
  copy_entry(fd, r);
  return r;
}

EXPORT int dup3(int oldfd, int newfd, int flags) {
  const int r = real().dup3(oldfd, newfd, flags);
  if (r < 0) return r;
  // newfd was closed by the kernel: drop what it was, keep the old alias.
  const std::shared_ptr<Conn> replaced = remove_conn(newfd);
  if (is_listener(newfd)) remove_listener(newfd);
  forget_epoll(newfd);
  stats::forget_fd(newfd);
  epoll_seen_by_kernel(oldfd);  // an epoll set now also answers under another number
  copy_entry(oldfd, newfd);
  return r;
}

EXPORT int dup2(int oldfd, int newfd) {
  if (oldfd == newfd) return real().dup2(oldfd, newfd);
  const int r = dup3(oldfd, newfd, 0);
  if (r < 0 && errno == EINVAL) return real().dup2(oldfd, newfd);
  return r;
}

// sendfile to an upgraded fd: read from the file, write to the stream (one
// copy; the kernel's zero-copy path does not exist for a user-space ring).
EXPORT ssize_t sendfile(int out, int in, off_t* offset, size_t count) {
  if (!is_conn(out)) return real().sendfile(out, in, offset, count);
  auto c = find_conn(out);
  if (!c) return real().sendfile(out, in, offset, count);
  char buf[64 * 1024];
  size_t done = 0;
  while (done < count) {
    const size_t want = count - done < sizeof buf ? count - done : sizeof buf;
    const ssize_t r = offset != nullptr ? real().pread(in, buf, want, *offset)
                                        : real().read(in, buf, want);
    if (r <= 0) {
      if (r < 0 && done == 0) return -1;
      break;
    }
    iovec v{buf, static_cast<size_t>(r)};
    const ssize_t w = conn_send(*c, out, &v, 1, 0);
    if (w <= 0) {
      if (done == 0) return -1;
      break;
    }
    // Bytes read but not accepted go back to the file position.
    if (offset != nullptr) {
      *offset += w;
    } else if (w < r) {
      (void)lseek(in, w - r, SEEK_CUR);
    }
    done += static_cast<size_t>(w);
    if (w < r) break;
  }
  return static_cast<ssize_t>(done);
}

EXPORT ssize_t sendfile64(int out, int in, off_t* offset, size_t count) {
  return sendfile(out, in, offset, count);
}
