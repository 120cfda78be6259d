// The data calls (docs/preload.md, "Interception"): each is one on_conn
// (hook.hpp), so an upgraded connection's bytes go through its stream
// (conn_io.hpp) and any other fd's straight to libc. read and write fall
// through to read and write themselves (not recv and send): a sandboxed
// process (sshd's seccomp filter) may allow only those.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "arrival.hpp"
#include "conn_io.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

// recvfrom on a connected TCP socket: the kernel reports no source
// address (the length set to 0, the address left untouched).
ssize_t recv_no_source(Conn& c, int fd, void* buf, size_t len, int flags,
                       const sockaddr* addr, socklen_t* alen) {
  const ssize_t r = conn_recv_buf(c, fd, buf, len, flags);
  if (r >= 0 && addr != nullptr && alen != nullptr) *alen = 0;
  return r;
}

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

ssize_t kernel_recvmsg(int fd, msghdr* msg, int flags, const void* caller) {
  const ssize_t r = real().recvmsg(fd, msg, flags);
  if (r >= 0 && msg->msg_controllen > 0) {
    if (internal_caller(caller)) {
      place_passed_fds(msg);
    } else {
      note_received(msg);  // a connection handed over by another process
    }
  }
  return r;
}

ssize_t stream_recvmsg(Conn& c, int fd, msghdr* msg, int flags) {
  const ssize_t r =
      conn_recv(c, fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  if (r >= 0) stream_recvmsg_fields(*msg);
  return r;
}

// sendfile to an upgraded fd: read from the file, write to the stream (one
// copy; the kernel's zero-copy path does not exist for a user-space ring).
ssize_t stream_sendfile(Conn& c, int out, int in, off_t* offset, size_t count) {
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
    const ssize_t w = conn_send_buf(c, out, buf, static_cast<size_t>(r), 0);
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

}  // namespace

EXPORT ssize_t read(int fd, void* buf, size_t len) {
  return on_conn(
      fd, [=](Conn& c) { return conn_recv_buf(c, fd, buf, len, 0); },
      [=] { return real().read(fd, buf, len); });
}

EXPORT ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  return on_conn(
      fd, [=](Conn& c) { return conn_recv_buf(c, fd, buf, std::min(len, buflen), 0); },
      [=] { return real().read_chk(fd, buf, len, buflen); });
}

namespace {
// 1 when a send's bytes may go ahead of the upgrade as early bytes, else 0:
// urgent data (the stream has none), and bytes the kernel may hold for a
// later send (MSG_MORE), whose count the commit could give too soon.
int plain_send(int flags) { return (flags & (MSG_OOB | MSG_MORE)) == 0 ? 1 : 0; }
}  // namespace

EXPORT ssize_t write(int fd, const void* buf, size_t len) {
  const iovec sent{const_cast<void*>(buf), len};  // NOLINT: iovec's type
  return on_conn<Use::kSend>(
      fd, [=](Conn& c) { return conn_send_buf(c, fd, buf, len, 0); },
      [=] { return real().write(fd, buf, len); }, &sent, 1);
}

EXPORT ssize_t readv(int fd, const iovec* iov, int n) {
  return on_conn(
      fd, [=](Conn& c) { return conn_recv(c, fd, iov, n, 0); },
      [=] { return real().readv(fd, iov, n); });
}

EXPORT ssize_t writev(int fd, const iovec* iov, int n) {
  return on_conn<Use::kSend>(
      fd, [=](Conn& c) { return conn_send(c, fd, iov, n, 0); },
      [=] { return real().writev(fd, iov, n); }, iov, n);
}

EXPORT ssize_t recv(int fd, void* buf, size_t len, int flags) {
  return on_conn(
      fd, [=](Conn& c) { return conn_recv_buf(c, fd, buf, len, flags); },
      [=] { return real().recv(fd, buf, len, flags); });
}

EXPORT ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  return on_conn(
      fd,
      [=](Conn& c) { return conn_recv_buf(c, fd, buf, std::min(len, buflen), flags); },
      [=] { return real().recv_chk(fd, buf, len, buflen, flags); });
}

EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  const iovec sent{const_cast<void*>(buf), len};  // NOLINT: iovec's type
  return on_conn<Use::kSend>(
      fd, [=](Conn& c) { return conn_send_buf(c, fd, buf, len, flags); },
      [=] { return real().send(fd, buf, len, flags); }, &sent, plain_send(flags));
}

EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* addr,
                        socklen_t* alen) {
  return on_conn(
      fd, [=](Conn& c) { return recv_no_source(c, fd, buf, len, flags, addr, alen); },
      [=] { return real().recvfrom(fd, buf, len, flags, addr, alen); });
}

EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags,
                              sockaddr* addr, socklen_t* alen) {
  return on_conn(
      fd,
      [=](Conn& c) {
        return recv_no_source(c, fd, buf, std::min(len, buflen), flags, addr, alen);
      },
      [=] { return real().recvfrom_chk(fd, buf, len, buflen, flags, addr, alen); });
}

// Connected: the address is ignored, as TCP does.
EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags,
                      const sockaddr* addr, socklen_t alen) {
  const iovec sent{const_cast<void*>(buf), len};  // NOLINT: iovec's type
  return on_conn<Use::kSend>(
      fd, [=](Conn& c) { return conn_send_buf(c, fd, buf, len, flags); },
      [=] { return real().sendto(fd, buf, len, flags, addr, alen); }, &sent,
      plain_send(flags));
}

EXPORT ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  const void* caller = CALLER;
  return on_conn(
      fd, [=](Conn& c) { return stream_recvmsg(c, fd, msg, flags); },
      [=] { return kernel_recvmsg(fd, msg, flags, caller); });
}

EXPORT ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  if (msg != nullptr && msg->msg_controllen > 0 && !internal_caller(CALLER)) {
    note_sent(msg);  // connections handed to another process stay shared
  }
  return on_conn<Use::kSend>(
      fd,
      [=](Conn& c) {
        return conn_send(c, fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
      },
      [=] { return real().sendmsg(fd, msg, flags); },
      msg != nullptr ? msg->msg_iov : nullptr,
      msg != nullptr && msg->msg_controllen == 0
          ? plain_send(flags) * static_cast<int>(msg->msg_iovlen)
          : 0);
}

EXPORT ssize_t sendfile(int out, int in, off_t* offset, size_t count) {
  return on_conn<Use::kWrite>(
      out, [=](Conn& c) { return stream_sendfile(c, out, in, offset, count); },
      [=] { return real().sendfile(out, in, offset, count); });
}

EXPORT ssize_t sendfile64(int out, int in, off_t* offset, size_t count) {
  return sendfile(out, in, offset, count);
}
