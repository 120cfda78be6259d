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

#include "harness.hpp"
#include "helpers.hpp"
#include "rdmakit/stream/stream.hpp"

namespace rdmakit::test {
namespace {

using namespace std::chrono_literals;
using stream::Engine;
using stream::EngineOptions;
using stream::Stream;

class LazyReadinessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void run(const RoleFn& server, const RoleFn& client) {
    run_roles(GetParam(), server, client, {});
  }
};

std::shared_ptr<Engine> make_engine(RoleEnv& env) {
  EngineOptions o;
  o.provider = env.kind();
  return Engine::create(o);
}

bool fd_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

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
        auto engine = make_engine(env);
        auto listener = engine->listen(env.listen_address());
        env.publish_port(listener->port());
        auto s = listener->accept(scaled(10s));
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
        EXPECT_TRUE(fd_readable(fd));  // never deferred, lazy or not
        EXPECT_EQ(s->read(buf, sizeof buf), 0);
      },
      [](RoleEnv& env) {
        auto engine = make_engine(env);
        const auto until = std::chrono::steady_clock::now() + scaled(10s);
        std::unique_ptr<Stream> s;
        while (!s) {
          try {
            s = engine->connect(env.server_address());
          } catch (const Error& e) {
            if (e.sys_errno() != ECONNREFUSED || std::chrono::steady_clock::now() > until)
              throw;
            std::this_thread::sleep_for(50ms);
          }
        }
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

INSTANTIATE_TEST_SUITE_P(Providers, LazyReadinessTest,
                         ::testing::ValuesIn(providers_from_env()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace rdmakit::test

int main(int argc, char** argv) {
  ::setenv("RDMAKIT_TEST_PROVIDERS", "shm,tcp", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
