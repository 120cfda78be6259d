#pragma once
// Data path of an upgraded fd: socket semantics (blocking, O_NONBLOCK,
// MSG_DONTWAIT/PEEK/WAITALL, SO_RCVTIMEO/SO_SNDTIMEO, EINTR, SIGPIPE) on top
// of the stream's non-blocking calls. Waiting is a poll() on the fd itself
// (the stream's readiness mirror), so signals interrupt it as they would a
// socket call.
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "state.hpp"

namespace rdmakit::preload {

// Return the socket-call result (>= 0) or -1 with errno set.
ssize_t conn_recv(Conn& c, int fd, const iovec* iov, int iovcnt, int flags);
ssize_t conn_send(Conn& c, int fd, const iovec* iov, int iovcnt, int flags);

// The same, for one buffer.
inline ssize_t conn_recv_buf(Conn& c, int fd, void* buf, size_t len, int flags) {
  iovec v{buf, len};
  return conn_recv(c, fd, &v, 1, flags);
}
inline ssize_t conn_send_buf(Conn& c, int fd, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};  // NOLINT: iovec is not const-correct
  return conn_send(c, fd, &v, 1, flags);
}

// The error that ended the stream, reported as kernel TCP reports a socket
// error: to the first call that looks (a read past the buffered bytes, a
// write, SO_ERROR), once; later reads then see end of stream and writes
// EPIPE. A failure after the peer's end of stream is not pending (writes
// get EPIPE, as in the kernel's CLOSE_WAIT). 0 when there is none or it was
// reported.
int take_stream_error(Conn& c) noexcept;

// What recvmsg leaves in the header of a connected TCP socket: no source
// address (msg_namelen 0; the address itself untouched), no ancillary data,
// no flags.
inline void stream_recvmsg_fields(msghdr& h) noexcept {
  if (h.msg_name != nullptr) h.msg_namelen = 0;
  h.msg_controllen = 0;
  h.msg_flags = 0;
}

}  // namespace rdmakit::preload
