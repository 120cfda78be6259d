/* The wait hooks' cost per call (bench/preload_wait_cost.sh): one process
 * holds N upgraded connections to a forked child in one epoll set, one of
 * them kept readable, and times epoll_wait(.., 0) (answered from user space:
 * the view of the set, one drain, one readiness scan, the kernel asked every
 * 8th call) and epoll_ctl(MOD) of one registration, each as the minimum over
 * BATCHES batches of CALLS calls (the least disturbed batch).
 *   preload_wait_cost N CALLS BATCHES
 * Prints "n=N epoll_wait W ns/call (reports R) epoll_ctl C ns/call". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kMax = 1024 };

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void must(int ok, const char* what) {
  if (!ok) {
    perror(what);
    exit(1);
  }
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 50;
  const int calls = argc > 2 ? atoi(argv[2]) : 2000;
  const int batches = argc > 3 ? atoi(argv[3]) : 200;
  must(n >= 2 && n <= kMax && calls > 0 && batches > 0, "arguments");
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  must(bind(l, (struct sockaddr*)&sa, len) == 0 && listen(l, 128) == 0 &&
           getsockname(l, (struct sockaddr*)&sa, &len) == 0,
       "listen");
  int quit[2];
  must(pipe(quit) == 0, "pipe");
  const pid_t pid = fork();
  must(pid >= 0, "fork");
  if (pid == 0) {
    static int fds[kMax];
    for (int i = 0; i < n; ++i) {  // one at a time: each is used (upgraded) at once
      fds[i] = socket(AF_INET, SOCK_STREAM, 0);
      must(connect(fds[i], (struct sockaddr*)&sa, sizeof sa) == 0, "connect");
      must(write(fds[i], "h", 1) == 1, "write");
    }
    must(write(fds[0], "xy", 2) == 2, "write");  // "y" stays unread: fds[0] readable
    char c;
    (void)read(quit[0], &c, 1);
    _exit(0);
  }
  static int conns[kMax];
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  for (int i = 0; i < n; ++i) {
    char c;
    conns[i] = accept(l, NULL, NULL);
    must(conns[i] >= 0 && read(conns[i], &c, 1) == 1, "accept");
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (unsigned)i};
    must(epoll_ctl(ep, EPOLL_CTL_ADD, conns[i], &ev) == 0, "epoll_ctl");
  }
  char c;
  must(read(conns[0], &c, 1) == 1, "read");
  struct epoll_event got[64];
  for (int k = 0; k < 1000 && epoll_wait(ep, got, 64, 10) < 1; ++k) {
  }
  double best_wait = 1e30;
  double best_ctl = 1e30;
  for (int b = 0; b < batches; ++b) {
    const double t0 = now_ns();
    for (int i = 0; i < calls; ++i) (void)epoll_wait(ep, got, 64, 0);
    const double t1 = now_ns();
    for (int i = 0; i < calls; ++i) {
      struct epoll_event ev = {.events = EPOLLIN,
                               .data.u64 = 1 + (unsigned)(i & 1) * 1000};
      (void)epoll_ctl(ep, EPOLL_CTL_MOD, conns[1], &ev);
    }
    const double t2 = now_ns();
    if ((t1 - t0) / calls < best_wait) best_wait = (t1 - t0) / calls;
    if ((t2 - t1) / calls < best_ctl) best_ctl = (t2 - t1) / calls;
  }
  const int r = epoll_wait(ep, got, 64, 0);
  printf("n=%d epoll_wait %.0f ns/call (reports %d) epoll_ctl %.0f ns/call\n", n,
         best_wait, r, best_ctl);
  must(write(quit[1], "q", 1) == 1, "write");
  waitpid(pid, NULL, 0);
  return r == 1 ? 0 : 1;
}
