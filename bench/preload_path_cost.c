/* Software cost of a preloaded connection's data path, without any cache line
 * crossing cores (bench/preload_stat_cost.sh): one thread holds both ends of a
 * loopback connection to its own listener (upgraded to shm under rdmakit-run),
 * and each iteration is a 16-byte send and recv each way. The best of ROUNDS
 * runs of ITERS iterations is printed in nanoseconds per round trip, so a
 * slower run (a preemption, another job) does not count.
 *   preload_path_cost ITERS ROUNDS
 * Prints "ns_per_round_trip". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int exact(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd, buf + got, n - got, 0);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: preload_path_cost ITERS ROUNDS\n");
    return 2;
  }
  const long iters = atol(argv[1]);
  const int rounds = atoi(argv[2]);
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 8) != 0 ||
      getsockname(l, (struct sockaddr*)&a, &al) != 0) {
    perror("listen");
    return 1;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (struct sockaddr*)&a, sizeof a) != 0) {
    perror("connect");
    return 1;
  }
  int s = accept(l, NULL, NULL);
  char msg[16] = "0123456789abcde", buf[16];
  double best = 1e30;
  for (int r = 0; r < rounds; r++) {
    const double t0 = now();
    for (long i = 0; i < iters; i++) {
      if (send(c, msg, sizeof msg, 0) != (ssize_t)sizeof msg || exact(s, buf, sizeof buf) ||
          send(s, buf, sizeof buf, 0) != (ssize_t)sizeof buf || exact(c, buf, sizeof buf)) {
        perror("round trip");
        return 1;
      }
    }
    const double ns = (now() - t0) * 1e9 / (double)iters;
    if (ns < best) best = ns;
  }
  if (memcmp(buf, msg, sizeof msg) != 0) {
    fprintf(stderr, "bytes differ\n");
    return 1;
  }
  printf("%.1f\n", best);
  return 0;
}
