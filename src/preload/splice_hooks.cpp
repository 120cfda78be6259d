// splice() with an upgraded connection at one end (haproxy moves bytes
// socket -> pipe -> socket this way). The kernel object behind an upgraded
// fd is the stream's readiness socket, so a splice passed through would
// put bytes where the peer never reads them, or take readiness bytes as
// data: the stream end is emulated with copies through a buffer, and only
// bytes the other end accepted are taken from either side:
//   stream -> pipe: peek the stream, write the pipe, consume what it took;
//   pipe -> stream: tee the pipe into a private pipe, send from a copy,
//                   consume from the pipe what the stream accepted.
// As the kernel: the other end must be a pipe (EINVAL), no offset on the
// socket end (EINVAL) nor on the pipe end (ESPIPE), SPLICE_F_NONBLOCK or an
// O_NONBLOCK pipe makes the pipe side non-blocking, the socket's own
// O_NONBLOCK its side. tee() and vmsplice() need pipes at both ends and
// fail on a readiness socket as on a TCP socket (EINVAL, EBADF): not hooked.
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "conn_io.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

constexpr size_t kChunk = size_t{64} * 1024;

bool is_pipe(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

bool pipe_nonblocking(int pipe_fd, unsigned flags) {
  return (flags & SPLICE_F_NONBLOCK) != 0 ||
         (real().fcntl(pipe_fd, F_GETFL) & O_NONBLOCK) != 0;
}

// Bytes the pipe takes now without blocking (its capacity less what it
// holds); -1 with errno on failure.
ssize_t pipe_room(int pipe_fd) {
  const int size = real().fcntl(pipe_fd, F_GETPIPE_SZ);
  int queued = 0;
  if (size < 0 || real().ioctl(pipe_fd, FIONREAD, &queued) != 0) return -1;
  return size > queued ? size - queued : 0;
}

ssize_t read_exact(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = real().read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    got += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

ssize_t stream_to_pipe(Conn& c, int fd, int pipe_fd, size_t len, unsigned flags) {
  if (len == 0) return 0;
  const bool nonblocking = pipe_nonblocking(pipe_fd, flags);
  ssize_t room = 0;
  for (;;) {  // as the kernel: room in the pipe first, then the data
    room = pipe_room(pipe_fd);
    if (room < 0) return -1;
    if (room > 0) break;
    if (nonblocking) {
      errno = EAGAIN;
      return -1;
    }
    pollfd p{pipe_fd, POLLOUT, 0};
    if (real().poll(&p, 1, -1) < 0) return -1;  // EINTR as the kernel's wait
  }
  char buf[kChunk];
  size_t want = len < sizeof buf ? len : sizeof buf;
  if (want > static_cast<size_t>(room)) want = static_cast<size_t>(room);
  iovec v{buf, want};
  const ssize_t r = conn_recv(c, fd, &v, 1, MSG_PEEK);
  if (r <= 0) return r;
  const ssize_t w = real().write(pipe_fd, buf, static_cast<size_t>(r));
  if (w <= 0) return w;
  v.iov_len = static_cast<size_t>(w);  // the peeked bytes are there: no wait
  const ssize_t taken = conn_recv(c, fd, &v, 1, MSG_DONTWAIT);
  if (taken != w) {
    // Another thread read the stream between the peek and here: what went
    // into the pipe is no longer what the stream held. Not recoverable.
    log_line(
        "splice fd=%d: the stream was read concurrently; %zd of %zd bytes "
        "consumed",
        fd, taken, w);
    errno = EIO;
    return -1;
  }
  return w;
}

ssize_t pipe_to_stream(int pipe_fd, Conn& c, int fd, size_t len, unsigned flags) {
  if (len == 0) return 0;
  int scratch[2];
  if (pipe2(scratch, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
  const unsigned tee_flags = pipe_nonblocking(pipe_fd, flags) ? SPLICE_F_NONBLOCK : 0;
  const ssize_t t = tee(pipe_fd, scratch[1], len < kChunk ? len : kChunk, tee_flags);
  ssize_t result = t;
  if (t > 0) {
    char buf[kChunk];
    result = read_exact(scratch[0], buf, static_cast<size_t>(t));
    if (result > 0) {
      iovec v{buf, static_cast<size_t>(t)};
      result = conn_send(c, fd, &v, 1, 0);
      // Only what the stream accepted leaves the pipe.
      if (result > 0 && read_exact(pipe_fd, buf, static_cast<size_t>(result)) != result) {
        errno = EIO;
        result = -1;
      }
    }
  }
  const int saved = errno;
  real().close(scratch[0]);
  real().close(scratch[1]);
  errno = saved;
  return result;
}

// The stream end of a splice: the other end must be a pipe, neither end an
// offset on the socket, and the pipe end no offset (as the kernel).
ssize_t splice_stream(Conn& c, bool stream_in, int in, loff_t* off_in, int out,
                      loff_t* off_out, size_t len, unsigned flags) {
  const int pipe_fd = stream_in ? out : in;
  const loff_t* sock_off = stream_in ? off_in : off_out;
  const loff_t* pipe_off = stream_in ? off_out : off_in;
  if (!is_pipe(pipe_fd) || sock_off != nullptr) {
    errno = EINVAL;
    return -1;
  }
  if (pipe_off != nullptr) {
    errno = ESPIPE;
    return -1;
  }
  return stream_in ? stream_to_pipe(c, in, out, len, flags)
                   : pipe_to_stream(in, c, out, len, flags);
}

}  // namespace

EXPORT ssize_t splice(int in, loff_t* off_in, int out, loff_t* off_out, size_t len,
                      unsigned flags) {
  return on_conn(
      in,
      [=](Conn& c) {
        // A stream at both ends: neither is a pipe.
        if (on_conn<Use::kWrite>(
                out, [](Conn&) { return true; }, [] { return false; })) {
          errno = EINVAL;
          return ssize_t{-1};
        }
        return splice_stream(c, true, in, off_in, out, off_out, len, flags);
      },
      [=] {
        // Into the connection: a write, which never starts a dormant relay.
        return on_conn<Use::kWrite>(
            out,
            [=](Conn& c) {
              return splice_stream(c, false, in, off_in, out, off_out, len, flags);
            },
            [=] { return real().splice(in, off_in, out, off_out, len, flags); });
      });
}
