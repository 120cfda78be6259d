/* Connection setup, one short-lived connection at a time (bench/preload_programs.sh,
 * row "setup"): the client connects, sends one byte, reads the one-byte answer
 * and closes; the server (one thread) accepts, reads, answers and closes. Each
 * connection is timed at the client, from socket() to close().
 *   preload_setup server PORTFILE N
 *   preload_setup client PORT N
 * The client prints one line: "rate p50_us p99_us max_us first_us", rate in
 * connections per second over the whole run, first_us the very first
 * connection's time (what a short-lived program pays once). */
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

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static struct sockaddr_in loopback(int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

static int serve(const char* portfile, int n) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = loopback(0);
  socklen_t al = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 1024) != 0 ||
      getsockname(l, (struct sockaddr*)&a, &al) != 0) {
    perror("listen");
    return 1;
  }
  FILE* f = fopen(portfile, "w");
  if (f == NULL) return 1;
  fprintf(f, "%d\n", ntohs(a.sin_port));
  fclose(f);
  for (int i = 0; i < n; i++) {
    int c = accept(l, NULL, NULL);
    char b;
    if (c < 0 || read(c, &b, 1) != 1 || write(c, &b, 1) != 1) {
      perror("server");
      return 1;
    }
    close(c);
  }
  return 0;
}

static int dial(int port, int n) {
  double* t = calloc((size_t)n, sizeof *t);
  if (t == NULL) return 1;
  const double start = now();
  for (int i = 0; i < n; i++) {
    const double t0 = now();
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = loopback(port);
    char b = 'x';
    if (connect(c, (struct sockaddr*)&a, sizeof a) != 0 || write(c, &b, 1) != 1 ||
        read(c, &b, 1) != 1 || b != 'x') {
      perror("client");
      return 1;
    }
    close(c);
    t[i] = now() - t0;
  }
  const double total = now() - start, first = t[0];
  qsort(t, (size_t)n, sizeof *t, cmp);
  printf("%.0f %.0f %.0f %.0f %.0f\n", n / total, t[n / 2] * 1e6, t[(n * 99) / 100] * 1e6,
         t[n - 1] * 1e6, first * 1e6);
  free(t);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: preload_setup server PORTFILE N | client PORT N\n");
    return 2;
  }
  const int n = atoi(argv[3]);
  if (n < 1) return 2;
  return strcmp(argv[1], "server") == 0 ? serve(argv[2], n) : dial(atoi(argv[2]), n);
}
