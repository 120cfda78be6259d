// Stream::set_lazy_readiness and Stream::last_events, which the preload's
// user-mode epoll relies on (docs/preload.md, "epoll"): while lazy, data
// arriving is not signalled on the readiness fd but last_events() shows it;
// turning lazy off brings the fd up to date at once; end of stream is
// signalled even while lazy; a read that empties the ring leaves the fd
// unreadable. Two processes per case (tests/support/harness.hpp), shm and tcp.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "conformance.hpp"
#include "stream_roles.hpp"

namespace rdmakit::test {
namespace {

using namespace std::chrono_literals;
using stream::Stream;

class LazyReadinessTest : public ProviderTest {};

// Drains the engine (as the preload's epoll spin does) until last_events()
// shows `want` (bounded).
short drain_until(Stream& s, short want) {
  const auto until = std::chrono::steady_clock::now() + scaled(5s);
  while (std::chrono::steady_clock::now() < until) {
    (void)s.poll_readiness(false);
    const short ev = s.last_events();
    if ((ev & want) != 0) return ev;
    std::this_thread::yield();
  }
  return s.last_events();
}

TEST_P(LazyReadinessTest, DataUnsignalledWhileLazyEndOfStreamSignalled) {
  run(
      [](RoleEnv& env) {
        auto [engine, listener, s] = serve(env);
        s->set_nonblocking(true);
        const int fd = s->fd();
        ASSERT_GE(fd, 0);
        s->set_lazy_readiness(true);
        char buf[64];
        for (int round = 0; round < 20; ++round) {
          ASSERT_EQ(s->write("1", 1), 1);  // the client sends 10 bytes
          ASSERT_TRUE(drain_until(*s, POLLIN) & POLLIN) << "round " << round;
          // The progress thread may collect it as well: never signalled.
          std::this_thread::sleep_for(1ms);
          EXPECT_FALSE(fd_readable(fd)) << "round " << round;
          EXPECT_TRUE(s->last_events() & POLLIN);
          if (round % 2 == 0) {
            // Off: the fd shows the data at once, and a read that takes it
            // all leaves the fd unreadable.
            s->set_lazy_readiness(false);
            EXPECT_TRUE(fd_readable(fd)) << "round " << round;
            ASSERT_EQ(s->read(buf, sizeof buf), 10);
            EXPECT_FALSE(fd_readable(fd));
            s->set_lazy_readiness(true);
          } else {
            ASSERT_EQ(s->read(buf, 4), 4);
            EXPECT_TRUE(s->last_events() & POLLIN);  // 6 bytes left
            ASSERT_EQ(s->read(buf, sizeof buf), 6);
            EXPECT_FALSE(s->last_events() & POLLIN);
            EXPECT_FALSE(fd_readable(fd));
          }
          EXPECT_EQ(s->read(buf, sizeof buf), -EAGAIN);
        }
        ASSERT_EQ(s->write("e", 1), 1);  // end of stream next
        EXPECT_TRUE(drain_until(*s, POLLRDHUP) & POLLRDHUP);
        // Never deferred, lazy or not. The engine publishes last_events()
        // before it brings the fd up to date (a thread woken by the fd must
        // find last_events() current), so the fd may follow a moment later:
        // bounded, where a deferred end of stream would never show.
        EXPECT_TRUE(fd_readable(fd, 2000));
        EXPECT_EQ(s->read(buf, sizeof buf), 0);
      },
      [](RoleEnv& env) {
        auto [engine, s] = dial(env);
        char c;
        for (int round = 0; round < 20; ++round) {
          ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
          ASSERT_EQ(s->write("0123456789", 10), 10);
        }
        ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
        EXPECT_EQ(s->shutdown(SHUT_WR), 0);
        EXPECT_EQ(s->read(&c, 1), 0);
      });
}

RDMAKIT_INSTANTIATE_PROVIDERS(LazyReadinessTest);

}  // namespace
}  // namespace rdmakit::test
