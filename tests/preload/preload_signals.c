/* A signal that arrives while an application's call waits on an upgraded
 * connection must act as on kernel TCP: its handler runs on the
 * application's thread, a recv without SA_RESTART and any poll end with
 * EINTR, and a recv under SA_RESTART goes on. Twice per mode: while the
 * first use waits for the upgrade (the server takes the client's offer up
 * only when it first writes, DELAY_MS after its accept), and on the
 * upgraded connection (the server writes again DELAY_MS later). Each time
 * the client's 50 ms timer fires inside the call.
 *   preload_signals server PORT DELAY_MS   (one connection, then exit)
 *   preload_signals recv-eintr|recv-restart|poll-eintr PORT
 * Exit 0 and "OK ..." when every check held. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "preload_check.h"

static volatile sig_atomic_t g_signals;
static volatile pid_t g_handler_tid;

static void on_alarm(int sig) {
  (void)sig;
  ++g_signals;
  g_handler_tid = gettid();
}

static void arm_alarm(int restart) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = restart ? SA_RESTART : 0;
  CHECK(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
  struct itimerval it = {.it_value = {.tv_usec = 50000}};
  CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
}

static int serve(int port, int delay_ms) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(l >= 0 && setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0,
        "socket");
  CHECK(bind(l, (struct sockaddr*)&sa, sizeof sa) == 0 && listen(l, 4) == 0, "listen");
  int s = accept(l, NULL, NULL);
  CHECK(s >= 0, "accept");
  sleep_ms(delay_ms);
  write_all(s, "x", 1); /* the first use: the upgrade happens now */
  char b;
  read_all(s, &b, 1);
  CHECK(b == 'y', "server read %c", b);
  sleep_ms(delay_ms);
  write_all(s, "z", 1);
  CHECK(read(s, &b, 1) == 0, "server: no end of stream");
  close(s);
  close(l);
  printf("OK server\n");
  return 0;
}

/* One blocking call that the 50 ms timer interrupts; the server's next byte
 * `expect` arrives later. */
static void interrupt_one(const char* mode, const char* phase, int c, char expect) {
  const pid_t me = gettid();
  const int restart =
      strcmp(mode, "recv-restart") == 0 || strcmp(mode, "poll-eintr") == 0;
  const sig_atomic_t before = g_signals;
  const int64_t start = now_ms();
  arm_alarm(restart);
  char b = 0;
  if (strcmp(mode, "poll-eintr") == 0) {
    /* poll is never restarted (signal(7)), SA_RESTART or not. */
    struct pollfd p = {c, POLLIN, 0};
    const int r = poll(&p, 1, WAIT_MS);
    CHECK(r == -1 && errno == EINTR, "%s: poll returned %d after %lld ms", phase, r,
          (long long)(now_ms() - start));
  } else if (restart) {
    const ssize_t r = recv(c, &b, 1, 0);
    CHECK(r == 1 && b == expect, "%s: restartable recv returned %zd after %lld ms", phase,
          r, (long long)(now_ms() - start));
  } else {
    const ssize_t r = recv(c, &b, 1, 0);
    CHECK(r == -1 && errno == EINTR, "%s: recv returned %zd after %lld ms", phase, r,
          (long long)(now_ms() - start));
  }
  CHECK(g_signals == before + 1, "%s: %d signals", phase, (int)(g_signals - before));
  CHECK(g_handler_tid == me, "%s: the handler ran on thread %d, not the caller %d", phase,
        (int)g_handler_tid, (int)me);
  if (b != expect) {
    const ssize_t r = recv(c, &b, 1, 0);
    CHECK(r == 1 && b == expect, "%s: recv after the signal returned %zd", phase, r);
  }
  printf("OK %s %s: signal after 50 ms, call ended after %lld ms\n", mode, phase,
         (long long)(now_ms() - start));
}

static int client(const char* mode, int port) {
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(c >= 0 && connect(c, (struct sockaddr*)&sa, sizeof sa) == 0, "connect");
  interrupt_one(mode, "during the upgrade", c, 'x');
  write_all(c, "y", 1);
  interrupt_one(mode, "upgraded", c, 'z');
  close(c);
  return 0;
}

int main(int argc, char** argv) {
  case_name = argc > 1 ? argv[1] : "";
  if (argc == 4 && strcmp(argv[1], "server") == 0)
    return serve(atoi(argv[2]), atoi(argv[3]));
  if (argc == 3) return client(argv[1], atoi(argv[2]));
  fprintf(stderr, "usage: preload_signals server PORT DELAY_MS | MODE PORT\n");
  return 2;
}
