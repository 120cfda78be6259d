#pragma once
// Data path of an upgraded fd: socket semantics (blocking, O_NONBLOCK,
// MSG_DONTWAIT/PEEK/WAITALL, SO_RCVTIMEO/SO_SNDTIMEO, EINTR, SIGPIPE) on top
// of the stream's non-blocking calls. Waiting is a poll() on the fd itself
// (the stream's readiness mirror), so signals interrupt it as they would a
// socket call.
#include <sys/types.h>
#include <sys/uio.h>

#include "state.hpp"

namespace rdmakit::preload {

// Return the socket-call result (>= 0) or -1 with errno set.
ssize_t conn_recv(Conn& c, int fd, const iovec* iov, int iovcnt, int flags);
ssize_t conn_send(Conn& c, int fd, const iovec* iov, int iovcnt, int flags);

}  // namespace rdmakit::preload
