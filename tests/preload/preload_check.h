/* What the preload's C test programs share: a CHECK that names the case,
 * file and line and exits, monotonic milliseconds, a nap that survives
 * signals, and blocking exact reads and writes for a case's control bytes.
 * Each program defines case_name. */
#pragma once
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 5000

static const char* case_name = "";

#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "FAIL %s (%s:%d) %s: ", case_name, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, " [errno %d %s]\n", errno, strerror(errno));                   \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static inline int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static inline void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

static inline void write_all(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    CHECK(w > 0, "write_all");
    c += w;
    n -= (size_t)w;
  }
}

static inline void read_all(int fd, void* p, size_t n) {
  char* c = (char*)p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r > 0, "read_all: %zd with %zu left", r, n);
    c += r;
    n -= (size_t)r;
  }
}
