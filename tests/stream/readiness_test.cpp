// The readiness fd (Stream::fd()) against lost wake-ups: a caller that reads
// next is not signalled for the data it takes (poll_readiness with
// reads_next), yet every sleeper on the fd is woken when data stays or
// arrives. Two processes per case (tests/support/harness.hpp), shm and tcp.
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "conformance.hpp"
#include "stream_roles.hpp"

namespace rdmakit::test {
namespace {

using namespace std::chrono_literals;
using stream::Stream;

class ReadinessTest : public ProviderTest {};

// Spins with reads_next until the stream shows POLLIN (bounded).
short spin_reads_next(Stream& s) {
  const auto until = std::chrono::steady_clock::now() + scaled(5s);
  short ev = 0;
  while (((ev = s.poll_readiness(false, true)) & POLLIN) == 0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  return ev;
}

// A reader that takes readiness from the ring with reads_next: after it
// empties the ring the fd is not readable; after it takes part of the data
// the fd is readable (a sleeper would be woken for the rest), level and
// edge triggered; end of stream is signalled.
TEST_P(ReadinessTest, ReadsNextKeepsTheFdTruthful) {
  run(
      [](RoleEnv& env) {
        auto [engine, listener, s] = serve(env);
        s->set_nonblocking(true);
        const int fd = s->fd();
        ASSERT_GE(fd, 0);
        const int ep = ::epoll_create1(EPOLL_CLOEXEC);
        epoll_event e{};
        e.events = EPOLLIN | EPOLLET;
        e.data.fd = fd;
        ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e), 0);
        epoll_event out[2];
        char buf[64];
        ASSERT_EQ(s->write("1", 1), 1);  // the client sends 10 bytes
        ASSERT_TRUE(spin_reads_next(*s) & POLLIN);
        ASSERT_EQ(s->read(buf, 4), 4);  // 6 bytes stay: the fd must show them
        EXPECT_TRUE(fd_readable(fd));
        EXPECT_EQ(::epoll_wait(ep, out, 2, static_cast<int>(scaled(5s).count())), 1);
        ASSERT_EQ(s->read(buf, sizeof buf), 6);
        EXPECT_FALSE(fd_readable(fd));
        ASSERT_EQ(s->write("2", 1), 1);  // 10 more bytes
        ASSERT_TRUE(spin_reads_next(*s) & POLLIN);
        ASSERT_EQ(s->read(buf, sizeof buf), 10);  // all of it
        EXPECT_FALSE(fd_readable(fd));
        EXPECT_EQ(std::string(buf, 10), "abcdefghij");
        ASSERT_EQ(s->write("3", 1), 1);  // end of stream
        const auto until = std::chrono::steady_clock::now() + scaled(5s);
        while ((s->poll_readiness(false, true) & POLLRDHUP) == 0 &&
               std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
        EXPECT_TRUE(fd_readable(fd));  // end of stream is never deferred
        EXPECT_EQ(s->read(buf, sizeof buf), 0);
        ::close(ep);
      },
      [](RoleEnv& env) {
        auto [engine, s] = dial(env);
        char c;
        ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
        ASSERT_EQ(s->write("0123456789", 10), 10);
        ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
        ASSERT_EQ(s->write("abcdefghij", 10), 10);
        ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
        EXPECT_EQ(s->shutdown(SHUT_WR), 0);
        EXPECT_EQ(s->read(&c, 1), 0);
      });
}

// Lost wake-up: many round trips in which the server spins a random while
// with reads_next (taking what it finds), then announces it will sleep and
// sleeps in poll() on the fd, while the client answers after a random
// delay (0 to 100 us), so arrivals land before, during and after the
// announcement. Every sleep must end with the message: a lost wake-up
// shows as a poll() that runs into its 5 s guard.
TEST_P(ReadinessTest, NoLostWakeUpAroundTheSleepAnnouncement) {
  constexpr int kRounds = 400;
  run(
      [](RoleEnv& env) {
        auto [engine, listener, s] = serve(env);
        s->set_nonblocking(true);
        const int fd = s->fd();
        ASSERT_GE(fd, 0);
        std::mt19937 rng(7);
        int slept = 0;
        for (int i = 0; i < kRounds; ++i) {
          const char ping = static_cast<char>('a' + i % 26);
          ASSERT_EQ(s->write(&ping, 1), 1);
          const auto spin_until =
              std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 60);
          bool got = false;
          while (!got && std::chrono::steady_clock::now() < spin_until)
            got = (s->poll_readiness(false, true) & POLLIN) != 0;
          if (!got && (s->poll_readiness(true) & POLLIN) == 0) {
            ++slept;
            pollfd p{fd, POLLIN, 0};
            ASSERT_EQ(::poll(&p, 1, static_cast<int>(scaled(5s).count())), 1)
                << "round " << i << ": the arrival did not wake the sleeper";
          }
          char pong = 0;
          const auto until = std::chrono::steady_clock::now() + scaled(5s);
          ssize_t rc;
          while ((rc = s->read(&pong, 1)) == -EAGAIN &&
                 std::chrono::steady_clock::now() < until) {
          }
          ASSERT_EQ(rc, 1) << "round " << i;
          ASSERT_EQ(pong, ping) << "round " << i;
          EXPECT_FALSE(fd_readable(fd)) << "round " << i << ": a stale readable fd";
        }
        EXPECT_GT(slept, 0);             // the sleep path was taken
        ASSERT_EQ(s->write("E", 1), 1);  // the client may close now
      },
      [](RoleEnv& env) {
        auto [engine, s] = dial(env);
        std::mt19937 rng(11);
        for (int i = 0; i < kRounds; ++i) {
          char c;
          ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);
          const auto at =
              std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 100);
          while (std::chrono::steady_clock::now() < at) {
          }
          ASSERT_EQ(s->write(&c, 1), 1);
        }
        char c;
        ASSERT_EQ(s->read(&c, 1, Stream::kWaitAll), 1);  // the server is done
      });
}

RDMAKIT_INSTANTIATE_PROVIDERS(ReadinessTest);

}  // namespace
}  // namespace rdmakit::test
