// The socket's metadata (docs/preload.md, "Interception"): fcntl, ioctl,
// getsockopt, setsockopt and the names. An upgraded fd keeps the kernel's
// view: options and names are the kernel TCP socket's, except what the
// stream answers itself (O_NONBLOCK, FIONREAD, SO_ERROR, the timeouts the
// data path applies). A pending connection stays pending (Use::kMeta).
#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>

#include "conn_io.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

bool dupfd(int cmd) { return cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC; }

int stream_fcntl(int (*libc_fcntl)(int, int, ...), Conn& c, int fd, int cmd, void* arg) {
  const auto iarg = static_cast<int>(reinterpret_cast<intptr_t>(arg));  // NOLINT
  switch (cmd) {
    case F_GETFL: {
      const int r = libc_fcntl(fd, F_GETFL);
      if (r < 0) return r;
      return (r & ~O_NONBLOCK) | (c.nonblocking ? O_NONBLOCK : 0);
    }
    case F_SETFL:
      c.nonblocking = (iarg & O_NONBLOCK) != 0;
      // The readiness socket itself always stays non-blocking.
      return libc_fcntl(fd, F_SETFL, iarg | O_NONBLOCK);
    case F_DUPFD:
    case F_DUPFD_CLOEXEC: {
      const int r = libc_fcntl(fd, cmd, iarg);
      if (r >= 0) forget_stale(r);
      if (r >= 0 && r < kMaxFd) copy_entry(fd, r);
      return r;
    }
    default: return libc_fcntl(fd, cmd, arg);
  }
}

// Any other fd: a new number names what fd names (a relayed connection's
// alias, an epoll set under another number).
int kernel_fcntl(int (*libc_fcntl)(int, int, ...), int fd, int cmd, void* arg,
                 const void* caller) {
  if (dupfd(cmd) && !internal_caller(caller) &&
      !app_number(static_cast<int>(reinterpret_cast<intptr_t>(arg)))) {  // NOLINT
    errno = EINVAL;  // as the kernel says of a lowest number past the limit
    return -1;
  }
  int r = libc_fcntl(fd, cmd, arg);
  if (r < 0 || !dupfd(cmd)) return r;
  r = internal_caller(caller) ? place_high(r) : app_fd(r);
  if (r < 0) return r;  // no room above the application's numbers, or past its limit
  forget_stale(r);
  epoll_seen_by_kernel(fd);  // an epoll set now also answers under another number
  copy_entry(fd, r);
  return r;
}

int fcntl_hook(int (*libc_fcntl)(int, int, ...), int fd, int cmd, void* arg,
               const void* caller) {
  return on_conn<Use::kMeta>(
      fd, [=](Conn& c) { return stream_fcntl(libc_fcntl, c, fd, cmd, arg); },
      [=] { return kernel_fcntl(libc_fcntl, fd, cmd, arg, caller); });
}

// NOLINTNEXTLINE(google-runtime-int): libc's type
int stream_ioctl(Conn& c, unsigned long req, void* arg) {
  switch (req) {
    case FIONBIO:
      if (arg == nullptr) break;
      c.nonblocking = *static_cast<int*>(arg) != 0;
      return 0;
    case FIONREAD:
      if (arg == nullptr) break;
      *static_cast<int*>(arg) = static_cast<int>(c.stream->available());
      return 0;
    case SIOCOUTQ:
      if (arg == nullptr) break;
      *static_cast<int*>(arg) = 0;
      return 0;
    default: return real().ioctl(c.tcp_fd, req, arg);
  }
  errno = EFAULT;
  return -1;
}

// A relayed connection (relay.hpp): its I/O and timeouts are the relay
// socket's, its names and every other option the kernel TCP socket's.
bool is_relay_socket(int fd) {
  const Entry e = entry_of(fd);
  return e == Entry::kRelayed || e == Entry::kDormant;
}

bool relay_side(int level, int name) {
  return level == SOL_SOCKET &&
         (name == SO_ERROR || name == SO_RCVTIMEO || name == SO_SNDTIMEO);
}

int kernel_getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  const bool relayed = is_relay_socket(fd);
  return real().getsockopt(relayed && relay_side(level, name) ? fd : kernel_socket(fd),
                           level, name, val, len);
}

int kernel_setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (is_relay_socket(fd) && relay_side(level, name)) {
    (void)real().setsockopt(fd, level, name, val, len);
  }
  return real().setsockopt(kernel_socket(fd), level, name, val, len);
}

int stream_getsockopt(Conn& c, int level, int name, void* val, socklen_t* len) {
  if (level == SOL_SOCKET && name == SO_ERROR && val != nullptr && len != nullptr &&
      *len >= sizeof(int)) {
    *static_cast<int*>(val) =
        take_stream_error(c);  // cleared by reading, as the kernel's
    *len = sizeof(int);
    return 0;
  }
  return real().getsockopt(c.tcp_fd, level, name, val, len);
}

int stream_setsockopt(Conn& c, int level, int name, const void* val, socklen_t len) {
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) &&
      val != nullptr && len >= sizeof(timeval)) {
    const auto* tv = static_cast<const timeval*>(val);
    const int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec;
    (name == SO_RCVTIMEO ? c.rcv_timeout_us : c.snd_timeout_us) = us;
  }
  // Stored by the kernel socket, so getsockopt answers as the kernel would.
  return real().setsockopt(c.tcp_fd, level, name, val, len);
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

EXPORT int ioctl(int fd, unsigned long req,  // NOLINT(google-runtime-int): libc's type
                 ...) {
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  // Close-on-exec belongs to the number itself, whatever file it names
  // (Python's os.set_inheritable uses these).
  if (req == FIOCLEX || req == FIONCLEX) return real().ioctl(fd, req, arg);
  const auto io = [=](Conn& c) { return stream_ioctl(c, req, arg); };
  const auto pass = [=] { return real().ioctl(fd, req, arg); };
  // FIONREAD and the like are a use; FIONBIO only sets a flag.
  return req == FIONBIO ? on_conn<Use::kMeta>(fd, io, pass) : on_conn(fd, io, pass);
}

EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  return on_conn<Use::kMeta>(
      fd, [=](Conn& c) { return stream_getsockopt(c, level, name, val, len); },
      [=] { return kernel_getsockopt(fd, level, name, val, len); });
}

EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  return on_conn<Use::kMeta>(
      fd, [=](Conn& c) { return stream_setsockopt(c, level, name, val, len); },
      [=] { return kernel_setsockopt(fd, level, name, val, len); });
}

EXPORT int getsockname(int fd, sockaddr* addr, socklen_t* len) {
  return real().getsockname(kernel_socket(fd), addr, len);
}

EXPORT int getpeername(int fd, sockaddr* addr, socklen_t* len) {
  return real().getpeername(kernel_socket(fd), addr, len);
}
