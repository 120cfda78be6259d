// Ping-pong whose waits are ppoll (client; fortified: __ppoll_chk) and
// epoll_pwait (server), with
// non-blocking sockets read until EAGAIN, for the preload's pwait-announce
// case (docs/preload.md, "Busy polling"). Every byte is checked; the client
// prints the mean and median round trip.
//   preload_pwait server PORTFILE ROUNDS   (listens on an ephemeral port)
//   preload_pwait client PORT ROUNDS
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int die(const char* what) {
  fprintf(stderr, "FAIL: %s: %s\n", what, strerror(errno));
  return 1;
}

static double elapsed_us(struct timespec a, struct timespec b) {
  return (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Reads one byte from non-blocking fd, waiting with ppoll or epoll_pwait.
static int get_byte(int fd, int ep, char* c) {
  sigset_t none;
  sigemptyset(&none);
  for (;;) {
    const ssize_t r = recv(fd, c, 1, 0);
    if (r == 1) return 0;
    if (r == 0) return -1;
    if (errno != EAGAIN) return -1;
    if (ep >= 0) {
      struct epoll_event ev;
      if (epoll_pwait(ep, &ev, 1, 10000, &none) != 1) return -1;
    } else {
      struct pollfd p[1] = {{fd, POLLIN, 0}};
      struct timespec t = {10, 0};
      // A count unknown at compile time over an array of known size: the
      // fortified build calls __ppoll_chk.
      volatile nfds_t n = 1;
      if (ppoll(p, n, &t, &none) != 1) return -1;
    }
  }
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const int rounds = atoi(argv[3]);
  alarm(60);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return die("socket");
  int fd;
  int ep = -1;
  if (argv[1][0] == 's') {
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr*)&a, sizeof a) != 0 || listen(s, 1) != 0 ||
        getsockname(s, (struct sockaddr*)&a, &len) != 0)
      return die("listen");
    FILE* f = fopen(argv[2], "w");
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    fd = accept(s, NULL, NULL);
    if (fd < 0) return die("accept");
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return die("epoll_ctl");
  } else {
    a.sin_port = htons((uint16_t)atoi(argv[2]));
    if (connect(s, (struct sockaddr*)&a, sizeof a) != 0) return die("connect");
    fd = s;
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) return die("fcntl");
  // Each round trip's time: the median tells a woken wait from a napping
  // one even when a loaded machine preempts some rounds (which moves the
  // mean, not the median).
  double* took = calloc((size_t)rounds, sizeof *took);
  if (took == NULL) return die("calloc");
  struct timespec t0, t1, r0, r1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < rounds; ++i) {
    clock_gettime(CLOCK_MONOTONIC, &r0);
    const char want = (char)('a' + i % 26);
    char c = 0;
    if (ep < 0 && send(fd, &want, 1, 0) != 1) return die("send");
    if (get_byte(fd, ep, &c) != 0) return die("wait/recv");
    if (c != want) {
      fprintf(stderr, "FAIL: round %d: got %d, want %d\n", i, c, want);
      return 1;
    }
    if (ep >= 0 && send(fd, &c, 1, 0) != 1) return die("send");
    clock_gettime(CLOCK_MONOTONIC, &r1);
    took[i] = elapsed_us(r0, r1);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  qsort(took, (size_t)rounds, sizeof *took, by_value);
  printf("OK %d round trips, mean %.1f us, median %.1f us\n", rounds,
         elapsed_us(t0, t1) / rounds, took[rounds / 2]);
  free(took);
  return 0;
}
