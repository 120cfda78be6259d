/* Socket-call semantics the preload must keep exactly as kernel TCP gives
 * them. Each case makes TCP connections on loopback between this process
 * (server side) and a forked child (client side) and checks what the calls
 * return. surface_test.sh runs every case twice: without the preload (the
 * assertions are then checked against the kernel itself) and under
 * rdmakit-run with both ends upgraded to shm. Every wait is bounded.
 *   preload_surface reset          peer killed with unread data (RST)
 *   preload_surface peer-close     writes after the peer closed (FIN)
 *   preload_surface recv-addr      recvfrom/recvmsg/recvmmsg address fields
 *   preload_surface splice         splice file->pipe->socket->pipe->file
 *   preload_surface nested-epoll   an epoll set inside another epoll set
 *   preload_surface pwait          ppoll, pselect, epoll_pwait, epoll_pwait2
 *   preload_surface abort          peer closed with unread data or SO_LINGER {1, 0}
 *   preload_surface hup            poll/epoll events after a reset and a peer's FIN
 * Exit 0 and "OK CASE" when every check held. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "preload_check.h"

static volatile sig_atomic_t sigpipes;
static volatile sig_atomic_t sigusr1s;
static void on_sigpipe(int sig) {
  (void)sig;
  ++sigpipes;
}
static void on_sigusr1(int sig) {
  (void)sig;
  ++sigusr1s;
}

static void wait_readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  CHECK(poll(&p, 1, WAIT_MS) == 1, "fd %d not readable in %d ms", fd, WAIT_MS);
}

/* One connection: the parent's accepted socket in *server; the forked child
 * runs client(fd) and exits with its status. Returns the child's pid. */
static pid_t connect_child(int* server, void (*client)(int fd, void* arg), void* arg) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(l >= 0, "socket");
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  CHECK(bind(l, (struct sockaddr*)&sa, len) == 0, "bind");
  CHECK(listen(l, 1) == 0, "listen");
  CHECK(getsockname(l, (struct sockaddr*)&sa, &len) == 0, "getsockname");
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(l);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "child socket");
    CHECK(connect(fd, (struct sockaddr*)&sa, len) == 0, "child connect");
    client(fd, arg);
    _exit(0);
  }
  *server = accept(l, NULL, NULL);
  CHECK(*server >= 0, "accept");
  close(l);
  return pid;
}

static void reap(pid_t pid, int want_signal) {
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  if (want_signal) {
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == want_signal, "child status 0x%x", st);
  } else {
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status 0x%x)", st);
  }
}

static int so_error(int fd) {
  int e = -1;
  socklen_t l = sizeof e;
  CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) == 0, "SO_ERROR");
  return e;
}

/* Expect -1 with errno e from a call. */
#define EXPECT_ERR(call, e)                                                          \
  do {                                                                               \
    errno = 0;                                                                       \
    ssize_t r_ = (call);                                                             \
    CHECK(r_ == -1 && errno == (e), "%s gave %zd, want -1 errno %d (%s)", #call, r_, \
          (e), strerror(e));                                                         \
  } while (0)

/* ---- reset: the peer goes away with bytes it never read (kernel: RST).
 * Whichever call looks first (read after the buffered bytes, write, or
 * SO_ERROR) reports ECONNRESET, once; then reads give 0 and writes EPIPE
 * with SIGPIPE unless MSG_NOSIGNAL. */
static void reset_client(int fd, void* arg) {
  (void)arg;
  write_all(fd, "hello", 5);
  wait_readable(fd); /* the server's 2 bytes arrived: left unread */
  raise(SIGKILL);
}

static int preloaded(void) {
  const char* p = getenv("LD_PRELOAD");
  return p != NULL && strstr(p, "rdmakit-preload") != NULL;
}

static void case_reset(void) {
  /* Four connections for four orders of looking, and a probe that
   * tells when the peers' death is visible (the kernel: at once, by RST;
   * the preload: when the stream learns its peer is gone). The probe's
   * read takes its own error only. */
  enum { kConns = 5 };
  int fds[kConns];
  pid_t pids[kConns];
  char buf[16];
  for (int i = 0; i < kConns; ++i) {
    pids[i] = connect_child(&fds[i], reset_client, NULL);
    wait_readable(fds[i]);
    write_all(fds[i], "zz", 2);
  }
  for (int i = 0; i < kConns; ++i) reap(pids[i], SIGKILL);
  const int probe = fds[kConns - 1];
  read_all(probe, buf, 5);
  const int64_t end = now_ms() + 10000;
  int err = 0;
  for (;;) {
    struct pollfd p = {probe, POLLIN, 0};
    CHECK(poll(&p, 1, 10000) == 1, "probe: nothing after the peer died");
    errno = 0;
    const ssize_t r = read(probe, buf, sizeof buf);
    CHECK(r == -1, "probe read gave %zd", r);
    if (errno != EAGAIN) {
      err = errno;
      break;
    }
    CHECK(now_ms() < end, "probe: no error 10 s after the peer died");
  }
  CHECK(err == ECONNRESET, "probe error %d (%s)", err, strerror(err));
  /* The other streams may learn of their peers' deaths later than the
   * probe: give them the same moment. */
  if (preloaded()) sleep_ms(2000);
  for (int variant = 0; variant < 4; ++variant) {
    const int fd = fds[variant];
    sigpipes = 0;
    if (variant == 0) { /* read first: the buffered bytes, the error, then 0 */
      CHECK(read(fd, buf, sizeof buf) == 5 && memcmp(buf, "hello", 5) == 0,
            "buffered bytes");
      EXPECT_ERR(read(fd, buf, sizeof buf), ECONNRESET);
      CHECK(read(fd, buf, sizeof buf) == 0, "read after the reported reset");
      CHECK(so_error(fd) == 0, "SO_ERROR after the reported reset");
      EXPECT_ERR(write(fd, "x", 1), EPIPE);
      CHECK(sigpipes == 1, "SIGPIPE count %d", (int)sigpipes);
    } else if (variant == 1) { /* write first: the error without SIGPIPE */
      EXPECT_ERR(write(fd, "x", 1), ECONNRESET);
      CHECK(sigpipes == 0, "SIGPIPE with the reset");
      EXPECT_ERR(write(fd, "x", 1), EPIPE);
      CHECK(sigpipes == 1, "SIGPIPE count %d", (int)sigpipes);
      EXPECT_ERR(send(fd, "x", 1, MSG_NOSIGNAL), EPIPE);
      CHECK(sigpipes == 1, "SIGPIPE despite MSG_NOSIGNAL");
      CHECK(read(fd, buf, sizeof buf) == 5, "buffered bytes after the reset");
      CHECK(read(fd, buf, sizeof buf) == 0, "read after the reported reset");
    } else if (variant == 3) { /* recvmmsg first */
      struct iovec iov[2] = {{buf, 8}, {buf + 8, 8}};
      struct mmsghdr mm[2];
      memset(mm, 0, sizeof mm);
      for (int i = 0; i < 2; ++i) {
        mm[i].msg_hdr.msg_iov = &iov[i];
        mm[i].msg_hdr.msg_iovlen = 1;
      }
      /* The kernel's recvmmsg looks at the socket error before any data. */
      EXPECT_ERR(recvmmsg(fd, mm, 2, 0, NULL), ECONNRESET);
      CHECK(read(fd, buf, sizeof buf) == 5, "buffered bytes after the reset");
      CHECK(read(fd, buf, sizeof buf) == 0, "read after the reported reset");
      const int n = recvmmsg(fd, mm, 2, 0, NULL);
      CHECK(n == 2 && mm[0].msg_len == 0 && mm[1].msg_len == 0,
            "recvmmsg at the end gave %d", n);
    } else { /* SO_ERROR first: it takes the error */
      CHECK(so_error(fd) == ECONNRESET, "SO_ERROR");
      CHECK(so_error(fd) == 0, "SO_ERROR twice");
      signal(SIGPIPE, SIG_IGN); /* ignored: EPIPE, nothing delivered */
      EXPECT_ERR(write(fd, "x", 1), EPIPE);
      signal(SIGPIPE, on_sigpipe);
      CHECK(sigpipes == 0, "SIGPIPE delivered while ignored");
      CHECK(read(fd, buf, sizeof buf) == 5, "buffered bytes after the reset");
      CHECK(read(fd, buf, sizeof buf) == 0, "read after the reported reset");
    }
  }
  for (int i = 0; i < kConns; ++i) close(fds[i]);
}

/* ---- peer-close: the peer closed (FIN) and left; our writes are then
 * refused with EPIPE and SIGPIPE (the kernel: the peer's RST arrives in
 * CLOSE_WAIT, which reports EPIPE, not ECONNRESET). Writes before that may
 * succeed (the kernel: exactly one; the preload: until the stream learns
 * the peer is gone). */
static void close_client(int fd, void* arg) {
  (void)arg;
  write_all(fd, "bye", 3);
  close(fd);
}

static void case_peer_close(void) {
  char buf[16];
  int fd;
  pid_t pid = connect_child(&fd, close_client, NULL);
  read_all(fd, buf, 3);
  CHECK(read(fd, buf, sizeof buf) == 0, "end of stream");
  reap(pid, 0);
  sigpipes = 0;
  const int64_t end = now_ms() + WAIT_MS;
  int writes = 0;
  for (;;) {
    errno = 0;
    const ssize_t w = send(fd, "x", 1, MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN) break;
    ++writes;
    CHECK(now_ms() < end, "writes still accepted %d ms after the peer left", WAIT_MS);
    sleep_ms(2);
  }
  CHECK(errno == EPIPE, "first refused write: errno %d, want EPIPE", errno);
  CHECK(sigpipes == 1, "SIGPIPE count %d", (int)sigpipes);
  EXPECT_ERR(write(fd, "x", 1), EPIPE);
  CHECK(sigpipes == 2, "SIGPIPE count %d", (int)sigpipes);
  EXPECT_ERR(send(fd, "x", 1, MSG_NOSIGNAL), EPIPE);
  CHECK(sigpipes == 2, "SIGPIPE despite MSG_NOSIGNAL");
  CHECK(read(fd, buf, sizeof buf) == 0, "read after EPIPE");
  CHECK(so_error(fd) == 0, "SO_ERROR after EPIPE");
  close(fd);
  (void)writes;
}

/* ---- recv-addr: on a connected TCP socket the kernel leaves a recvfrom
 * address untouched and sets its length to 0; recvmsg/recvmmsg set
 * msg_namelen 0, msg_controllen 0 (no ancillary data) and msg_flags 0. */
static void addr_client(int fd, void* arg) {
  (void)arg;
  char buf[1];
  write_all(fd, "abcdefgh", 8);
  read_all(fd, buf, 1); /* until the server is done */
}

static void case_recv_addr(void) {
  int fd;
  pid_t pid = connect_child(&fd, addr_client, NULL);
  char buf[8];
  struct sockaddr_storage from;
  unsigned char pattern[sizeof from];
  memset(pattern, 0x55, sizeof pattern);

  memset(&from, 0x55, sizeof from);
  socklen_t fl = sizeof from;
  CHECK(recvfrom(fd, buf, 1, MSG_WAITALL, (struct sockaddr*)&from, &fl) == 1 &&
            buf[0] == 'a',
        "recvfrom");
  CHECK(fl == 0, "recvfrom address length %u, want 0", (unsigned)fl);
  CHECK(memcmp(&from, pattern, sizeof from) == 0, "recvfrom wrote the address");

  char cbuf[64];
  struct iovec iov = {buf, 1};
  struct msghdr m = {.msg_name = &from,
                     .msg_namelen = sizeof from,
                     .msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = cbuf,
                     .msg_controllen = sizeof cbuf,
                     .msg_flags = 0x7777};
  CHECK(recvmsg(fd, &m, MSG_WAITALL) == 1 && buf[0] == 'b', "recvmsg");
  CHECK(m.msg_namelen == 0, "recvmsg msg_namelen %u, want 0", (unsigned)m.msg_namelen);
  CHECK(memcmp(&from, pattern, sizeof from) == 0, "recvmsg wrote the address");
  CHECK(m.msg_controllen == 0 && m.msg_flags == 0, "recvmsg controllen %zu flags 0x%x",
        (size_t)m.msg_controllen, m.msg_flags);

  struct mmsghdr mm[2];
  struct iovec iov2[2] = {{buf, 3}, {buf + 3, 3}};
  for (int i = 0; i < 2; ++i) {
    mm[i].msg_hdr = (struct msghdr){.msg_name = &from,
                                    .msg_namelen = sizeof from,
                                    .msg_iov = &iov2[i],
                                    .msg_iovlen = 1,
                                    .msg_control = cbuf,
                                    .msg_controllen = sizeof cbuf,
                                    .msg_flags = 0x7777};
    mm[i].msg_len = 12345;
  }
  int n = recvmmsg(fd, mm, 2, MSG_WAITALL, NULL);
  CHECK(n == 2, "recvmmsg gave %d", n);
  CHECK(mm[0].msg_len == 3 && mm[1].msg_len == 3 && memcmp(buf, "cdefgh", 6) == 0,
        "recvmmsg bytes");
  for (int i = 0; i < 2; ++i) {
    CHECK(mm[i].msg_hdr.msg_namelen == 0, "recvmmsg[%d] msg_namelen %u", i,
          (unsigned)mm[i].msg_hdr.msg_namelen);
    CHECK(mm[i].msg_hdr.msg_controllen == 0 && mm[i].msg_hdr.msg_flags == 0,
          "recvmmsg[%d] controllen/flags", i);
  }
  CHECK(memcmp(&from, pattern, sizeof from) == 0, "recvmmsg wrote the address");
  write_all(fd, "k", 1);
  reap(pid, 0);
  close(fd);
}

/* ---- splice: file -> pipe -> socket on the client, socket -> pipe -> file
 * on the server, blocking and with SPLICE_F_NONBLOCK on a non-blocking
 * socket; every byte must arrive in order (a splice that reached the
 * kernel object behind an upgraded fd would lose them). */
#define SPLICE_SIZE (3u << 20)
#define SPLICE_MORE 70000u
static unsigned char pattern_byte(size_t i) {
  return (unsigned char)((i * 2654435761u) >> 13);
}

static int pattern_file(void) {
  char path[] = "/tmp/rdmakit-surface-XXXXXX";
  int f = mkstemp(path);
  CHECK(f >= 0, "mkstemp");
  unlink(path);
  static unsigned char chunk[65536];
  for (size_t off = 0; off < SPLICE_SIZE; off += sizeof chunk) {
    for (size_t i = 0; i < sizeof chunk; ++i) chunk[i] = pattern_byte(off + i);
    CHECK(pwrite(f, chunk, sizeof chunk, (off_t)off) == (ssize_t)sizeof chunk, "pwrite");
  }
  return f;
}

static void splice_client(int fd, void* arg) {
  (void)arg;
  int f = pattern_file();
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  loff_t off = 0;
  size_t sent = 0;
  while (sent < SPLICE_SIZE) {
    /* Uneven pieces: 1 byte, then up to 100 KiB. */
    size_t want = sent == 0 ? 1 : 100000;
    if (want > SPLICE_SIZE - sent) want = SPLICE_SIZE - sent;
    ssize_t in = splice(f, &off, p[1], NULL, want, 0);
    CHECK(in > 0, "splice file->pipe");
    while (in > 0) {
      ssize_t out = splice(p[0], NULL, fd, NULL, (size_t)in, SPLICE_F_MORE);
      CHECK(out > 0, "splice pipe->socket gave %zd", out);
      in -= out;
      sent += (size_t)out;
    }
  }
  /* A tee from a socket is EINVAL, as for any non-pipe. */
  EXPECT_ERR(tee(fd, p[1], 1, 0), EINVAL);
  char cmd;
  read_all(fd, &cmd, 1); /* 'm': more, for the full-pipe round */
  static unsigned char more[SPLICE_MORE];
  for (size_t i = 0; i < sizeof more; ++i) more[i] = pattern_byte(SPLICE_SIZE + i);
  write_all(fd, more, sizeof more);
  read_all(fd, &cmd, 1);
}

static void case_splice(void) {
  int fd;
  pid_t pid = connect_child(&fd, splice_client, NULL);
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  static unsigned char got[65536 * 2];
  size_t recvd = 0;
  int rounds = 0;
  /* Half the transfer blocking, half non-blocking (EAGAIN, then poll). */
  while (recvd < SPLICE_SIZE) {
    const int nb = recvd >= SPLICE_SIZE / 2;
    if (nb && fcntl(fd, F_GETFL) >= 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0) {
      CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
    }
    ssize_t in = splice(fd, NULL, p[1], NULL, sizeof got / 2,
                        nb ? SPLICE_F_NONBLOCK | SPLICE_F_MOVE : SPLICE_F_MOVE);
    if (in < 0 && errno == EAGAIN && nb) {
      wait_readable(fd);
      continue;
    }
    CHECK(in > 0, "splice socket->pipe gave %zd after %zu bytes", in, recvd);
    read_all(p[0], got, (size_t)in);
    for (ssize_t i = 0; i < in; ++i) {
      CHECK(got[i] == pattern_byte(recvd + (size_t)i), "byte %zu differs",
            recvd + (size_t)i);
    }
    recvd += (size_t)in;
    ++rounds;
    CHECK(rounds < 100000, "too many rounds");
  }
  /* Nothing more: a non-blocking splice finds nothing. */
  EXPECT_ERR(splice(fd, NULL, p[1], NULL, 10, SPLICE_F_NONBLOCK), EAGAIN);
  /* A socket never takes an offset (EINVAL: it has no pread). */
  loff_t off = 0;
  EXPECT_ERR(splice(fd, &off, p[1], NULL, 10, SPLICE_F_NONBLOCK), EINVAL);
  /* A pipe of one page: a non-blocking splice into it when it is full is
   * EAGAIN though the socket holds data, and no byte is lost. */
  CHECK(fcntl(p[1], F_SETPIPE_SZ, 4096) == 4096, "F_SETPIPE_SZ");
  write_all(fd, "m", 1);
  int full_refusals = 0;
  while (recvd < SPLICE_SIZE + SPLICE_MORE) {
    wait_readable(fd);
    for (int k = 0;; ++k) { /* until the pipe refuses */
      CHECK(k < 1000, "a 4096-byte pipe never refused");
      const ssize_t in = splice(fd, NULL, p[1], NULL, SPLICE_MORE, SPLICE_F_NONBLOCK);
      if (in < 0) {
        CHECK(errno == EAGAIN, "splice");
        break;
      }
      CHECK(in > 0, "splice gave 0 before the end");
    }
    int queued = 0;
    CHECK(ioctl(p[0], FIONREAD, &queued) == 0, "FIONREAD");
    CHECK(queued <= 4096, "%d bytes in a 4096-byte pipe", queued);
    if (queued > 0) ++full_refusals;
    read_all(p[0], got, (size_t)queued);
    for (int i = 0; i < queued; ++i) {
      CHECK(got[i] == pattern_byte(recvd + (size_t)i), "byte %zu differs",
            recvd + (size_t)i);
    }
    recvd += (size_t)queued;
  }
  CHECK(full_refusals > 0, "never refused while holding data");
  CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0, "blocking again");
  write_all(fd, "k", 1);
  reap(pid, 0);
  close(fd);
}

/* ---- nested-epoll: the connection in an inner epoll set, the inner epoll
 * fd in an outer set; waiting on the outer set must wake when the peer
 * writes (level-triggered and edge-triggered outer registration). */
static void nested_client(int fd, void* arg) {
  (void)arg;
  char c;
  for (int i = 0; i < 3; ++i) {
    read_all(fd, &c, 1); /* the server is about to wait */
    sleep_ms(50);
    write_all(fd, "n", 1);
  }
  /* Stay until the server has made its last check: our end of stream
   * arriving earlier is a new edge for its edge-triggered wait. */
  read_all(fd, &c, 1);
}

static void case_nested_epoll(void) {
  int fd;
  pid_t pid = connect_child(&fd, nested_client, NULL);
  int inner = epoll_create1(EPOLL_CLOEXEC);
  int outer = epoll_create1(EPOLL_CLOEXEC);
  CHECK(inner >= 0 && outer >= 0, "epoll_create1");
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
  CHECK(epoll_ctl(inner, EPOLL_CTL_ADD, fd, &ev) == 0, "inner add");
  ev = (struct epoll_event){.events = EPOLLIN, .data.fd = inner};
  CHECK(epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev) == 0, "outer add");
  for (int round = 0; round < 3; ++round) {
    if (round == 2) { /* edge-triggered outer registration */
      ev = (struct epoll_event){.events = EPOLLIN | EPOLLET, .data.fd = inner};
      CHECK(epoll_ctl(outer, EPOLL_CTL_MOD, inner, &ev) == 0, "outer mod");
    }
    struct epoll_event got;
    CHECK(epoll_wait(outer, &got, 1, 0) == 0, "outer ready before the peer wrote");
    write_all(fd, "w", 1);
    const int64_t t0 = now_ms();
    const int n = epoll_wait(outer, &got, 1, WAIT_MS);
    CHECK(n == 1 && got.data.fd == inner && (got.events & EPOLLIN) != 0,
          "outer wait gave %d after %lld ms", n, (long long)(now_ms() - t0));
    CHECK(epoll_wait(inner, &got, 1, 0) == 1 && got.data.fd == fd, "inner wait");
    char c;
    CHECK(read(fd, &c, 1) == 1 && c == 'n', "read");
    if (round == 2) CHECK(epoll_wait(outer, &got, 1, 0) == 0, "edge reported twice");
  }
  write_all(fd, "d", 1);
  reap(pid, 0);
  close(outer);
  close(inner);
  close(fd);
}

/* ---- pwait: ppoll, pselect, epoll_pwait and epoll_pwait2 on an upgraded
 * fd: readiness when the peer writes, EINTR when a signal the call's mask
 * unblocks arrives (SIGUSR1 is blocked outside the call), no EINTR when the
 * call's mask blocks it, and the process mask restored afterwards. */
enum { kPpoll, kPselect, kEpollPwait, kEpollPwait2, kWaitKinds };
static const char* const kind_name[] = {"ppoll", "pselect", "epoll_pwait",
                                        "epoll_pwait2"};

static int epoll_pwait2_call(int ep, struct epoll_event* ev, int n,
                             const struct timespec* t, const sigset_t* mask) {
#ifdef SYS_epoll_pwait2
  return epoll_pwait2(ep, ev, n, t, mask);
#else
  (void)ep, (void)ev, (void)n, (void)t, (void)mask;
  errno = ENOSYS;
  return -1;
#endif
}

/* One wait of kind for POLLIN on fd; returns the call's result. */
static int wait_kind(int kind, int fd, int ep, int ms, const sigset_t* mask) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  struct epoll_event ev;
  switch (kind) {
    case kPpoll: {
      struct pollfd p = {fd, POLLIN, 0};
      const int r = ppoll(&p, 1, &ts, mask);
      if (r == 1) CHECK(p.revents == POLLIN, "ppoll revents 0x%x", p.revents);
      return r;
    }
    case kPselect: {
      fd_set rd;
      FD_ZERO(&rd);
      FD_SET(fd, &rd);
      const int r = pselect(fd + 1, &rd, NULL, NULL, &ts, mask);
      if (r == 1) CHECK(FD_ISSET(fd, &rd), "pselect set");
      return r;
    }
    case kEpollPwait: {
      const int r = epoll_pwait(ep, &ev, 1, ms, mask);
      if (r == 1)
        CHECK(ev.data.fd == fd && (ev.events & EPOLLIN) != 0, "epoll_pwait event");
      return r;
    }
    default: {
      const int r = epoll_pwait2_call(ep, &ev, 1, &ts, mask);
      if (r == 1)
        CHECK(ev.data.fd == fd && (ev.events & EPOLLIN) != 0, "epoll_pwait2 event");
      return r;
    }
  }
}

/* The client answers commands: 'w' write a byte after 50 ms, 's' send
 * SIGUSR1 to the server after 50 ms, 'q' quit. */
static void pwait_client(int fd, void* arg) {
  (void)arg;
  for (;;) {
    char c;
    read_all(fd, &c, 1);
    if (c == 'q') return;
    sleep_ms(50);
    if (c == 'w') write_all(fd, "d", 1);
    if (c == 's') CHECK(kill(getppid(), SIGUSR1) == 0, "kill");
  }
}

static void case_pwait(void) {
  int fd;
  struct sigaction sa = {.sa_handler = on_sigusr1};
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
  sigset_t usr1, old, open_mask, closed_mask, now;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  CHECK(sigprocmask(SIG_BLOCK, &usr1, &old) == 0, "block SIGUSR1");
  CHECK(sigprocmask(SIG_SETMASK, NULL, &closed_mask) == 0, "mask");
  open_mask = closed_mask;
  sigdelset(&open_mask, SIGUSR1);
  pid_t pid = connect_child(&fd, pwait_client, NULL);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
  CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll");
  int have_pwait2 = 1;
  {
    struct epoll_event e;
    struct timespec z = {0, 0};
    if (epoll_pwait2_call(ep, &e, 1, &z, NULL) < 0 && errno == ENOSYS) have_pwait2 = 0;
  }
  for (int kind = 0; kind < kWaitKinds; ++kind) {
    if (kind == kEpollPwait2 && !have_pwait2) {
      printf("epoll_pwait2: not supported by this kernel (ENOSYS), not checked\n");
      continue;
    }
    char c;
    /* Readiness: the peer writes 50 ms into the wait. */
    CHECK(wait_kind(kind, fd, ep, 0, &open_mask) == 0, "%s ready early", kind_name[kind]);
    write_all(fd, "w", 1);
    int64_t t0 = now_ms();
    int r = wait_kind(kind, fd, ep, WAIT_MS, &open_mask);
    CHECK(r == 1, "%s gave %d after %lld ms, want 1 (readable)", kind_name[kind], r,
          (long long)(now_ms() - t0));
    CHECK(read(fd, &c, 1) == 1 && c == 'd', "read");
    /* A signal the call's mask unblocks: EINTR, handler run. */
    sigusr1s = 0;
    write_all(fd, "s", 1);
    t0 = now_ms();
    r = wait_kind(kind, fd, ep, WAIT_MS, &open_mask);
    CHECK(r == -1 && errno == EINTR && sigusr1s == 1,
          "%s gave %d (signals %d) after %lld ms", kind_name[kind], r, (int)sigusr1s,
          (long long)(now_ms() - t0));
    CHECK(sigprocmask(SIG_SETMASK, NULL, &now) == 0 && sigismember(&now, SIGUSR1),
          "%s left SIGUSR1 unblocked", kind_name[kind]);
    /* A signal the call's mask blocks: no EINTR, the wait times out, the
     * signal stays pending until the mask opens. */
    write_all(fd, "s", 1);
    r = wait_kind(kind, fd, ep, 300, &closed_mask);
    CHECK(r == 0 && sigusr1s == 1, "%s with SIGUSR1 blocked gave %d (signals %d)",
          kind_name[kind], r, (int)sigusr1s);
    sigset_t pending;
    const int64_t until = now_ms() + WAIT_MS; /* a loaded machine may send it late */
    while (sigpending(&pending) == 0 && !sigismember(&pending, SIGUSR1) &&
           now_ms() < until) {
      sleep_ms(5);
    }
    CHECK(sigismember(&pending, SIGUSR1), "SIGUSR1 not pending");
    CHECK(sigprocmask(SIG_SETMASK, &open_mask, NULL) == 0, "open");
    CHECK(sigusr1s == 2, "pending SIGUSR1 not delivered");
    CHECK(sigprocmask(SIG_SETMASK, &closed_mask, NULL) == 0, "close");
  }
  write_all(fd, "q", 1);
  reap(pid, 0);
  sigprocmask(SIG_SETMASK, &old, NULL);
  close(ep);
  close(fd);
}

/* ---- abort: the peer closes with bytes it never read, or with SO_LINGER
 * {1, 0} (the kernel: RST instead of FIN). Our reads give the bytes that
 * had arrived, then ECONNRESET once, then 0; writes EPIPE with SIGPIPE. */
enum abort_how { kAbortUnread, kAbortLinger, kAbortLingerNothing };

static void abort_client(int fd, void* arg) {
  const enum abort_how how = *(enum abort_how*)arg;
  if (how != kAbortUnread) {
    struct linger lg = {1, 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER");
  }
  if (how != kAbortLingerNothing) write_all(fd, "hello", 5);
  wait_readable(fd); /* the server's 2 bytes arrived */
  char buf[2];
  if (how != kAbortUnread) read_all(fd, buf, 2); /* linger: nothing left unread */
  close(fd);
}

static void case_abort(void) {
  enum { kConns = 3 };
  enum abort_how how[kConns] = {kAbortUnread, kAbortLinger, kAbortLingerNothing};
  int fds[kConns];
  pid_t pids[kConns];
  char buf[16];
  for (int i = 0; i < kConns; ++i) {
    pids[i] = connect_child(&fds[i], abort_client, &how[i]);
    if (how[i] != kAbortLingerNothing) wait_readable(fds[i]);
    write_all(fds[i], "zz", 2);
  }
  for (int i = 0; i < kConns; ++i) reap(pids[i], 0);
  for (int i = 0; i < kConns; ++i) {
    const int fd = fds[i];
    sigpipes = 0;
    if (how[i] != kAbortLingerNothing)
      CHECK(read(fd, buf, sizeof buf) == 5 && memcmp(buf, "hello", 5) == 0,
            "conn %d: buffered bytes", i);
    /* Blocking: waits for the reset where it is not there yet. */
    EXPECT_ERR(read(fd, buf, sizeof buf), ECONNRESET);
    CHECK(read(fd, buf, sizeof buf) == 0, "conn %d: read after the reported reset", i);
    CHECK(so_error(fd) == 0, "conn %d: SO_ERROR after the reported reset", i);
    EXPECT_ERR(write(fd, "x", 1), EPIPE);
    CHECK(sigpipes == 1, "conn %d: SIGPIPE count %d", i, (int)sigpipes);
    close(fd);
  }
}

/* ---- hup: poll and epoll events (EPOLLRDHUP asked) on a connection whose
 * peer sent FIN (shutdown(SHUT_WR)) and on one whose peer reset it. */
static void hup_client(int fd, void* arg) {
  const int reset = *(int*)arg;
  if (reset) {
    struct linger lg = {1, 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER");
  } else {
    CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
  }
  wait_readable(fd); /* the server says when to go */
  char c;
  read_all(fd, &c, 1);
  close(fd);
}

static short poll_now(int fd, short events) {
  struct pollfd p = {fd, events, 0};
  CHECK(poll(&p, 1, 0) >= 0, "poll");
  return p.revents;
}

static uint32_t epoll_now(int fd, uint32_t events) {
  int ep = epoll_create1(0);
  CHECK(ep >= 0, "epoll_create1");
  struct epoll_event ev = {.events = events, .data.fd = fd};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl");
  struct epoll_event out;
  const int n = epoll_wait(ep, &out, 1, 0);
  CHECK(n >= 0, "epoll_wait");
  close(ep);
  return n == 1 ? out.events : 0;
}

/* Waits (bounded) until poll shows want on fd. */
static void wait_events(int fd, short want) {
  const int64_t end = now_ms() + WAIT_MS;
  while ((poll_now(fd, POLLIN | POLLOUT | POLLRDHUP) & want) != want) {
    CHECK(now_ms() < end, "fd %d: events 0x%x never showed 0x%x", fd,
          poll_now(fd, POLLIN | POLLOUT | POLLRDHUP), want);
    sleep_ms(1);
  }
}

static void case_hup(void) {
  int fin_fd, rst_fd;
  int fin = 0, rst = 1;
  const pid_t fin_pid = connect_child(&fin_fd, hup_client, &fin);
  const pid_t rst_pid = connect_child(&rst_fd, hup_client, &rst);
  const short all = POLLIN | POLLOUT | POLLRDHUP;
  /* The peer's FIN: readable (end of stream) and read-hung-up, still writable. */
  wait_events(fin_fd, POLLIN | POLLRDHUP);
  short r = poll_now(fin_fd, all);
  CHECK(r == (POLLIN | POLLOUT | POLLRDHUP), "FIN: poll 0x%x", r);
  r = poll_now(fin_fd, POLLIN | POLLOUT);
  CHECK(r == (POLLIN | POLLOUT), "FIN: poll without POLLRDHUP asked 0x%x", r);
  uint32_t e = epoll_now(fin_fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  CHECK(e == (EPOLLIN | EPOLLOUT | EPOLLRDHUP), "FIN: epoll 0x%x", e);
  e = epoll_now(fin_fd, EPOLLIN | EPOLLOUT);
  CHECK(e == (EPOLLIN | EPOLLOUT), "FIN: epoll without EPOLLRDHUP asked 0x%x", e);

  /* The peer's reset, seen first by an edge-triggered epoll asleep on it. */
  int ep = epoll_create1(0);
  CHECK(ep >= 0, "epoll_create1");
  struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = rst_fd};
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, rst_fd, &ev) == 0, "epoll_ctl");
  struct epoll_event out;
  CHECK(epoll_wait(ep, &out, 1, 0) == 0, "ET epoll before the reset");
  write_all(rst_fd, "g", 1);
  CHECK(
      epoll_wait(ep, &out, 1, WAIT_MS) == 1 && (out.events & (EPOLLERR | EPOLLHUP)) != 0,
      "ET epoll: no EPOLLERR/EPOLLHUP after the reset");
  reap(rst_pid, 0);
  const short reset = POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP;
  wait_events(rst_fd, reset);
  r = poll_now(rst_fd, all);
  CHECK(r == reset, "reset: poll 0x%x", r);
  r = poll_now(rst_fd, POLLIN);
  CHECK(r == (POLLIN | POLLERR | POLLHUP), "reset: poll with POLLIN asked 0x%x", r);
  e = epoll_now(rst_fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  CHECK(e == (uint32_t)reset, "reset: epoll 0x%x", e);
  e = epoll_now(rst_fd, 0);
  CHECK(e == (EPOLLERR | EPOLLHUP), "reset: epoll with nothing asked 0x%x", e);
  /* Once the error is taken, POLLERR goes; the hang-up stays. */
  char buf[4];
  EXPECT_ERR(read(rst_fd, buf, sizeof buf), ECONNRESET);
  r = poll_now(rst_fd, all);
  CHECK(r == (POLLIN | POLLOUT | POLLRDHUP | POLLHUP), "reset, error taken: poll 0x%x",
        r);
  e = epoll_now(rst_fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
  CHECK(e == (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP),
        "reset, error taken: epoll 0x%x", e);
  CHECK(read(rst_fd, buf, sizeof buf) == 0, "read after the reported reset");
  close(ep);
  write_all(fin_fd, "g", 1);
  reap(fin_pid, 0);
  close(fin_fd);
  close(rst_fd);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr,
            "usage: %s reset|peer-close|recv-addr|splice|nested-epoll|pwait|abort|hup\n",
            argv[0]);
    return 2;
  }
  case_name = argv[1];
  struct sigaction sa = {.sa_handler = on_sigpipe};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, NULL);
  alarm(60); /* never hang a test run */
  if (strcmp(case_name, "reset") == 0) {
    case_reset();
  } else if (strcmp(case_name, "peer-close") == 0) {
    case_peer_close();
  } else if (strcmp(case_name, "recv-addr") == 0) {
    case_recv_addr();
  } else if (strcmp(case_name, "splice") == 0) {
    case_splice();
  } else if (strcmp(case_name, "nested-epoll") == 0) {
    case_nested_epoll();
  } else if (strcmp(case_name, "pwait") == 0) {
    case_pwait();
  } else if (strcmp(case_name, "abort") == 0) {
    case_abort();
  } else if (strcmp(case_name, "hup") == 0) {
    case_hup();
  } else {
    fprintf(stderr, "unknown case %s\n", case_name);
    return 2;
  }
  printf("OK %s\n", case_name);
  return 0;
}
