/* Both ends of one TCP connection, for the preload tests: the client sends
 * SIZE bytes of a seeded pattern (non-blocking connect + poll + SO_ERROR,
 * writev/send in uneven pieces), half-closes, and reads SIZE bytes back;
 * the server (accept4 SOCK_NONBLOCK, a forked child that closes its copy and
 * exits, then epoll) checks what it got byte for byte, then answers with its
 * own pattern. Every wait is bounded (10 s).
 *   preload_pair server PORTFILE SIZE      (listens on 127.0.0.1:0)
 *   preload_pair client PORT SIZE
 *   preload_pair forge-uid|forge-tuple PORT SIZE DIR
 * The forge modes are a client that is not preloaded but plants a
 * rendezvous offer for its own connection in the server's directory DIR:
 * forge-uid offers from a socket that listens as uid 65534 (the server must
 * refuse it by SO_PEERCRED), forge-tuple offers a well-formed offer naming
 * another connection (the server must refuse it). Either way the connection
 * must stay on kernel TCP and carry every byte.
 * Exit 0 and "OK ..." when every byte matched. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 10000

static volatile sig_atomic_t signals;
static void on_signal(int sig) {
  (void)sig;
  ++signals;
}

static void set_blocking(int fd, int blocking) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) {
    perror("F_GETFL");
    exit(1);
  }
  fl = blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK;
  if (fcntl(fd, F_SETFL, fl) != 0 || ((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0) == blocking) {
    perror("F_SETFL O_NONBLOCK");
    exit(1);
  }
}

static void die(const char* what) {
  fprintf(stderr, "preload_pair: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ULL;
  return (uint8_t)(x >> 56);
}

static void wait_fd(int fd, short ev) {
  struct pollfd p = {fd, ev, 0};
  int r = poll(&p, 1, WAIT_MS);
  if (r < 0) die("poll");
  if (r == 0) {
    fprintf(stderr, "preload_pair: timed out waiting for %s\n", ev == POLLIN ? "input" : "output");
    exit(1);
  }
}

/* Sends size bytes of pattern(seed) in uneven pieces, rotating through
 * writev, send, sendmsg, sendmmsg (two messages) and sendto, waiting with poll on
 * EAGAIN. */
static void send_pattern(int fd, uint64_t seed, size_t size) {
  static uint8_t buf[70000];
  size_t off = 0, piece = 1;
  unsigned turn = 0;
  while (off < size) {
    size_t n = piece < size - off ? piece : size - off;
    if (n > sizeof buf) n = sizeof buf;
    for (size_t i = 0; i < n; ++i) buf[i] = pattern(seed, off + i);
    size_t done = 0;
    while (done < n) {
      ssize_t w;
      size_t left = n - done, half = left / 2;
      struct iovec v[2] = {{buf + done, half}, {buf + done + half, left - half}};
      switch (turn++ % 5) {
        case 0: w = writev(fd, v, 2); break;
        case 4: w = sendto(fd, buf + done, left, MSG_NOSIGNAL, NULL, 0); break;
        case 1: w = send(fd, buf + done, left, MSG_NOSIGNAL); break;
        case 2: {
          struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
          w = sendmsg(fd, &m, MSG_NOSIGNAL);
          break;
        }
        default: {
          /* Two messages: both pieces, then an empty one (two non-empty
           * messages could leave a gap after a short first one). */
          struct mmsghdr mm[2];
          memset(mm, 0, sizeof mm);
          mm[0].msg_hdr.msg_iov = v;
          mm[0].msg_hdr.msg_iovlen = 2;
          int k = sendmmsg(fd, mm, 2, MSG_NOSIGNAL);
          if (k == 2 && mm[1].msg_len != 0) {
            fprintf(stderr, "preload_pair: sendmmsg returned %d (second length %u)\n", k, mm[1].msg_len);
            exit(1);
          }
          w = k < 0 ? -1 : (ssize_t)mm[0].msg_len;
          break;
        }
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_fd(fd, POLLOUT);
        continue;
      }
      if (w < 0) die("send");
      done += (size_t)w;
    }
    off += n;
    piece = piece * 3 + 7;
    if (piece > 65536) piece = piece % 4099 + 1;
  }
}

static void check_bytes(const uint8_t* b, size_t n, uint64_t seed, size_t* off, size_t size) {
  for (size_t i = 0; i < n; ++i) {
    if (*off + i >= size || b[i] != pattern(seed, *off + i)) {
      fprintf(stderr, "preload_pair: byte %zu differs (or beyond %zu)\n", *off + i, size);
      exit(1);
    }
  }
  *off += n;
}

/* Reads until end of stream, rotating through recv, readv, recvmsg,
 * recvmmsg (two messages, MSG_WAITFORONE), read, recv and recvfrom of a
 * length the compiler cannot see (the fortified __read_chk, __recv_chk and
 * __recvfrom_chk); checks
 * length and every byte. FIONREAD must never promise more than a read
 * then returns. */

/* s is readable for good now (the client's FIN): level-triggered epoll
 * reports it on every wait, EPOLLET once (no new edge), EPOLLONESHOT once
 * (then disarmed). With a busy-poll budget the hooks spin on the rings
 * first; the kernel must still decide. */
static int wait_count(int ep, int ms) {
  struct epoll_event ev;
  int n = epoll_wait(ep, &ev, 1, ms);
  if (n < 0) die("epoll_wait");
  return n;
}
static void check_epoll_modes(int s, int lt) {
  int et = epoll_create1(EPOLL_CLOEXEC);
  int os = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event e1 = {.events = EPOLLIN | EPOLLET, .data.fd = s};
  struct epoll_event e2 = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = s};
  if (et < 0 || os < 0 || epoll_ctl(et, EPOLL_CTL_ADD, s, &e1) != 0 ||
      epoll_ctl(os, EPOLL_CTL_ADD, s, &e2) != 0)
    die("epoll ET/ONESHOT");
  int got[6] = {wait_count(lt, 100), wait_count(lt, 100), wait_count(et, 100),
                wait_count(et, 50), wait_count(os, 100), wait_count(os, 50)};
  if (got[0] != 1 || got[1] != 1 || got[2] != 1 || got[3] != 0 || got[4] != 1 || got[5] != 0) {
    fprintf(stderr,
            "preload_pair: epoll at end of stream: LT %d %d (want 1 1), ET %d %d (want 1 0), "
            "ONESHOT %d %d (want 1 0)\n",
            got[0], got[1], got[2], got[3], got[4], got[5]);
    exit(1);
  }
  close(et);
  close(os);
}

static void recv_pattern(int fd, int ep, uint64_t seed, size_t size) {
  static uint8_t buf[65536];
  size_t off = 0;
  unsigned turn = 0;
  volatile size_t odd = 1; /* a length unknown at compile time */
  for (;;) {
    int avail = -1;
    if (ioctl(fd, FIONREAD, &avail) != 0 || avail < 0) die("ioctl FIONREAD");
    ssize_t r;
    size_t half = sizeof buf / 2;
    struct iovec v[2] = {{buf, half}, {buf + half, sizeof buf - half}};
    int two = 0;
    struct mmsghdr mm[2];
    struct sockaddr_storage from;
    socklen_t fromlen = sizeof from;
    switch (turn++ % 7) {
      case 0: r = recv(fd, buf, sizeof buf, 0); break;
      case 1: r = readv(fd, v, 2); break;
      case 2: {
        struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
        r = recvmsg(fd, &m, 0);
        break;
      }
      case 3: {
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &v[0];
        mm[0].msg_hdr.msg_iovlen = 1;
        mm[1].msg_hdr.msg_iov = &v[1];
        mm[1].msg_hdr.msg_iovlen = 1;
        int k = recvmmsg(fd, mm, 2, MSG_WAITFORONE, NULL);
        r = k < 0 ? -1 : (ssize_t)mm[0].msg_len;
        two = k == 2; /* the second message's bytes follow the first's */
        break;
      }
      case 4: r = read(fd, buf, sizeof buf - odd); break;
      case 5: r = recv(fd, buf, sizeof buf - odd, 0); break;
      default:
        fromlen = sizeof from;
        r = recvfrom(fd, buf, sizeof buf - odd, 0, (struct sockaddr*)&from, &fromlen);
        /* The kernel names no address on TCP (length 0), nor does the preload. */
        if (r >= 0 && fromlen != 0) {
          fprintf(stderr, "preload_pair: recvfrom named an address (length %u)\n",
                  (unsigned)fromlen);
          exit(1);
        }
        break;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (ep >= 0) {
        struct epoll_event ev;
        int n = epoll_wait(ep, &ev, 1, WAIT_MS);
        if (n < 0) die("epoll_wait");
        if (n == 0) {
          fprintf(stderr, "preload_pair: epoll timed out at byte %zu of %zu\n", off, size);
          exit(1);
        }
      } else {
        wait_fd(fd, POLLIN);
      }
      continue;
    }
    if (r < 0) die("recv");
    size_t total = (size_t)r + (two ? mm[1].msg_len : 0);
    if (avail > 0 && total < (size_t)avail && total < sizeof buf - odd) {
      fprintf(stderr, "preload_pair: FIONREAD said %d bytes, a read returned %zu\n", avail, total);
      exit(1);
    }
    if (r == 0 && !(two && mm[1].msg_len > 0)) break;
    check_bytes(buf, (size_t)r, seed, &off, size);
    if (two) check_bytes(buf + half, mm[1].msg_len, seed, &off, size);
  }
  if (off != size) {
    fprintf(stderr, "preload_pair: got %zu bytes, expected %zu\n", off, size);
    exit(1);
  }
}

/* The rendezvous records of src/preload/rendezvous.cpp, as a peer sees them. */
struct tuple {
  uint8_t family, pad[3], client_addr[16], server_addr[16];
  uint16_t client_port, server_port;
};
struct offer {
  uint32_t magic, version;
  struct tuple t;
  uint8_t nonce[16];
  uint16_t stream_port;
  uint8_t pad[6];
};

/* Binds c, plants the offer socket for its connection to port, connects. */
static int forge(int c, struct sockaddr_in* server, const char* dir, int drop_uid) {
  struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t ml = sizeof me;
  if (bind(c, (struct sockaddr*)&me, sizeof me) != 0 ||
      getsockname(c, (struct sockaddr*)&me, &ml) != 0) die("bind");
  struct tuple t;
  memset(&t, 0, sizeof t);
  t.family = AF_INET;
  memcpy(t.client_addr, &me.sin_addr, 4);
  memcpy(t.server_addr, &server->sin_addr, 4);
  t.client_port = me.sin_port;
  t.server_port = server->sin_port;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < sizeof t; ++i) h = (h ^ ((uint8_t*)&t)[i]) * 1099511628211ULL;
  struct stat ns;
  if (stat("/proc/self/ns/net", &ns) != 0) die("netns");
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/net-%lu/o-%016llx", dir, (unsigned long)ns.st_ino,
           (unsigned long long)h);
  int u = socket(AF_UNIX, SOCK_STREAM, 0);
  if (u < 0 || bind(u, (struct sockaddr*)&sa, sizeof sa) != 0) die(sa.sun_path);
  /* SO_PEERCRED reports the credentials of listen() time. */
  if (drop_uid && (setgid(65534) != 0 || setuid(65534) != 0)) die("setuid 65534");
  if (listen(u, 1) != 0) die("listen");
  if (connect(c, (struct sockaddr*)server, sizeof *server) != 0) die("connect");
  if (drop_uid) {
    /* Wait for the server to look, and to hang up on us. */
    struct pollfd p = {u, POLLIN, 0};
    if (poll(&p, 1, WAIT_MS) != 1) die("the server did not look for the offer");
    int a = accept(u, NULL, NULL);
    if (a < 0) die("accept");
    uint8_t b;
    struct pollfd q = {a, POLLIN, 0};
    if (poll(&q, 1, WAIT_MS) != 1 || read(a, &b, 1) != 0) {
      fprintf(stderr, "preload_pair: the server did not hang up on the other uid\n");
      exit(1);
    }
    close(a);
  } else {
    struct pollfd p = {u, POLLIN, 0};
    if (poll(&p, 1, WAIT_MS) != 1) die("the server did not look for the offer");
    int a = accept(u, NULL, NULL);
    if (a < 0) die("accept");
    struct offer o;
    memset(&o, 0, sizeof o);
    o.magic = 0x31504b52;
    o.version = 3; /* wire::kVersion */
    o.t = t;
    o.t.client_port = htons((uint16_t)(ntohs(t.client_port) + 1)); /* another connection */
    o.stream_port = 1;
    if (write(a, &o, sizeof o) != (ssize_t)sizeof o) die("write offer");
    uint8_t answer[24];
    struct pollfd q = {a, POLLIN, 0};
    if (poll(&q, 1, WAIT_MS) != 1 || read(a, answer, sizeof answer) != (ssize_t)sizeof answer ||
        answer[4] == 0) {
      fprintf(stderr, "preload_pair: the forged offer was not refused\n");
      exit(1);
    }
    close(a);
  }
  close(u);
  unlink(sa.sun_path);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && strncmp(argv[1], "forge-", 6) == 0) {
    size_t size = strtoull(argv[3], NULL, 10);
    struct sockaddr_in server = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                 .sin_port = htons((uint16_t)atoi(argv[2]))};
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0) die("socket");
    forge(c, &server, argv[4], strcmp(argv[1], "forge-uid") == 0);
    send_pattern(c, 1, size);
    if (shutdown(c, SHUT_WR) != 0) die("shutdown");
    recv_pattern(c, -1, 2, size);
    close(c);
    printf("OK forged offer refused; %zu bytes each way on kernel TCP\n", size);
    return 0;
  }
  if (argc != 4) {
    fprintf(stderr, "usage: preload_pair server PORTFILE SIZE | client PORT SIZE\n");
    return 2;
  }
  size_t size = strtoull(argv[3], NULL, 10);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (strcmp(argv[1], "server") == 0) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) die("socket");
    if (bind(l, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(l, 16) != 0) die("bind/listen");
    socklen_t sl = sizeof sa;
    if (getsockname(l, (struct sockaddr*)&sa, &sl) != 0) die("getsockname");
    FILE* pf = fopen(argv[2], "w");
    if (!pf) die("port file");
    fprintf(pf, "%d\n", ntohs(sa.sin_port));
    fclose(pf);
    struct pollfd p = {l, POLLIN, 0};
    if (poll(&p, 1, WAIT_MS) != 1) die("no client within 10 s");
    int s = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) die("accept4");
    if (!(fcntl(s, F_GETFL) & O_NONBLOCK)) {
      fprintf(stderr, "preload_pair: accept4(SOCK_NONBLOCK) socket is blocking\n");
      return 1;
    }
    /* A fork-for-work child (redis BGSAVE, system()) closes its copy and
     * exits through atexit: the parent's connection must not notice. */
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
      close(s);
      close(l);
      exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "preload_pair: forked child failed\n");
      return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = s};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0) die("epoll");
    recv_pattern(s, ep, 1, size);
    check_epoll_modes(s, ep);
    /* Blocking for the answer: FIONBIO off. */
    int off = 0;
    if (ioctl(s, FIONBIO, &off) != 0) die("ioctl FIONBIO");
    send_pattern(s, 2, size);
    if (close(s) != 0 || close(ep) != 0 || close(l) != 0) die("close");
    printf("OK server received %zu bytes, sent %zu\n", size, size);
    return 0;
  }
  sa.sin_port = htons((uint16_t)atoi(argv[2]));
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0) die("socket");
  int one = 1;
  if (setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
  if (fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) != 0) die("O_NONBLOCK");
  if (connect(c, (struct sockaddr*)&sa, sizeof sa) != 0) {
    if (errno != EINPROGRESS) die("connect");
    wait_fd(c, POLLOUT);
  }
  int err = -1;
  socklen_t el = sizeof err;
  if (getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
    fprintf(stderr, "preload_pair: SO_ERROR %d\n", err);
    return 1;
  }
  struct sockaddr_in peer;
  socklen_t pl = sizeof peer;
  if (getpeername(c, (struct sockaddr*)&peer, &pl) != 0 || peer.sin_port != sa.sin_port) {
    fprintf(stderr, "preload_pair: getpeername does not name the server\n");
    return 1;
  }
  /* The server sends nothing before it has all our bytes, so a blocking
   * recv now waits, and a signal (no SA_RESTART) must interrupt it. */
  set_blocking(c, 1);
  struct sigaction sa_alrm = {.sa_handler = on_signal};
  if (sigaction(SIGALRM, &sa_alrm, NULL) != 0) die("sigaction");
  struct itimerval it = {.it_value = {.tv_usec = 50000}};
  if (setitimer(ITIMER_REAL, &it, NULL) != 0) die("setitimer");
  uint8_t one_byte;
  ssize_t rr = recv(c, &one_byte, 1, 0);
  if (rr != -1 || errno != EINTR || signals != 1) {
    fprintf(stderr, "preload_pair: blocking recv under SIGALRM returned %zd (%s), %d signals\n", rr,
            strerror(errno), (int)signals);
    return 1;
  }
  set_blocking(c, 0);
  /* Aliases: dup, F_DUPFD_CLOEXEC, dup2 share the connection; closing all
   * but one of them must leave it open. */
  int d = dup(c);
  int e = d < 0 ? -1 : fcntl(d, F_DUPFD_CLOEXEC, 100);
  if (d < 0 || e < 100 || !(fcntl(e, F_GETFD) & FD_CLOEXEC)) die("dup/F_DUPFD_CLOEXEC");
  if (close(d) != 0 || dup2(e, 150) != 150 || close(e) != 0) die("dup2");
  send_pattern(150, 1, size);
  if (close(150) != 0) die("close alias");
  if (shutdown(c, SHUT_WR) != 0) die("shutdown");
  /* Writing after our own SHUT_WR: EPIPE, and SIGPIPE unless MSG_NOSIGNAL
   * (the server is still sending, so no reset can come first). */
  struct sigaction sa_pipe = {.sa_handler = on_signal};
  if (sigaction(SIGPIPE, &sa_pipe, NULL) != 0) die("sigaction");
  signals = 0;
  if (send(c, "x", 1, MSG_NOSIGNAL) != -1 || errno != EPIPE || signals != 0) {
    fprintf(stderr, "preload_pair: MSG_NOSIGNAL send after SHUT_WR: %s, %d SIGPIPE\n", strerror(errno),
            (int)signals);
    return 1;
  }
  if (write(c, "x", 1) != -1 || errno != EPIPE || signals != 1) {
    fprintf(stderr, "preload_pair: write after SHUT_WR: %s, %d SIGPIPE\n", strerror(errno), (int)signals);
    return 1;
  }
  recv_pattern(c, -1, 2, size);
  if (close_range((unsigned)c, (unsigned)c, 0) != 0) die("close_range");
  printf("OK client sent %zu bytes, received %zu\n", size, size);
  return 0;
}
