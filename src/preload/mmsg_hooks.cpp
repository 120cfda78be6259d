// sendmmsg/recvmmsg on upgraded connections: one stream send or receive per
// message, with the kernel's semantics for a TCP socket (each message is a
// sendmsg/recvmsg; the count of messages done is returned, an error only
// when none was; MSG_WAITFORONE turns the later receives non-blocking; the
// timeout is checked after each message, as the kernel does; a connected
// TCP socket reports no source address: msg_namelen 0). Every other fd (UDP:
// the resolver uses sendmmsg) goes straight to libc.
#include <sys/socket.h>
#include <time.h>

#include <cerrno>
#include <chrono>

#include "conn_io.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

int stream_sendmmsg(Conn& c, int fd, mmsghdr* vec, unsigned vlen, int flags) {
  unsigned done = 0;
  for (; done < vlen; ++done) {
    msghdr& h = vec[done].msg_hdr;
    const ssize_t r = conn_send(c, fd, h.msg_iov, static_cast<int>(h.msg_iovlen), flags);
    if (r < 0) break;
    vec[done].msg_len = static_cast<unsigned>(r);
  }
  if (done == 0 && vlen > 0) return -1;  // errno from the first send
  return static_cast<int>(done);
}

int stream_recvmmsg(Conn& c, int fd, mmsghdr* vec, unsigned vlen, int flags,
                    timespec* timeout) {
  using Clock = std::chrono::steady_clock;
  const bool timed = timeout != nullptr;
  if (timed &&
      (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000L)) {
    errno = EINVAL;
    return -1;
  }
  const auto end = timed ? Clock::now() + std::chrono::seconds(timeout->tv_sec) +
                               std::chrono::nanoseconds(timeout->tv_nsec)
                         : Clock::time_point{};
  // As the kernel's recvmmsg: a pending socket error first, before any data.
  if (const int e = take_stream_error(c); e != 0) {
    errno = e;
    return -1;
  }
  int each = flags & ~MSG_WAITFORONE;
  unsigned done = 0;
  int err = 0;
  while (done < vlen) {
    msghdr& h = vec[done].msg_hdr;
    const ssize_t r = conn_recv(c, fd, h.msg_iov, static_cast<int>(h.msg_iovlen), each);
    if (r < 0) {
      err = errno;
      break;
    }
    stream_recvmsg_fields(h);
    vec[done].msg_len = static_cast<unsigned>(r);
    ++done;
    if ((flags & MSG_WAITFORONE) != 0) each |= MSG_DONTWAIT;
    if (timed && Clock::now() >= end) break;
  }
  if (timed) {
    const auto left =
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - Clock::now());
    const int64_t ns = left.count() > 0 ? left.count() : 0;
    timeout->tv_sec = static_cast<time_t>(ns / 1000000000);
    timeout->tv_nsec = static_cast<long>(ns % 1000000000);  // NOLINT(google-runtime-int)
  }
  // The kernel keeps an error met after some messages for the next call.
  if (done > 0 && err != 0 && err == c.stream->error()) {
    c.error_reported.store(false, std::memory_order_release);
  }
  if (done == 0 && vlen > 0) {
    errno = err;
    return -1;
  }
  return static_cast<int>(done);
}

}  // namespace

EXPORT int sendmmsg(int fd, mmsghdr* vec, unsigned vlen, int flags) {
  return on_conn<Use::kWrite>(
      fd, [=](Conn& c) { return stream_sendmmsg(c, fd, vec, vlen, flags); },
      [=] { return real().sendmmsg(fd, vec, vlen, flags); });
}

EXPORT int recvmmsg(int fd, mmsghdr* vec, unsigned vlen, int flags, timespec* timeout) {
  return on_conn(
      fd, [=](Conn& c) { return stream_recvmmsg(c, fd, vec, vlen, flags, timeout); },
      [=] { return real().recvmmsg(fd, vec, vlen, flags, timeout); });
}
