// Stream protocol cases at exact moments, staged with the fake provider.
// Each names the mechanism it checks; without it the case fails (a hang
// ends in the case's own time limit, never in ctest's).
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "fake_provider.hpp"
#include "rdmakit/stream/stream.hpp"

namespace rdmakit::fake {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

stream::StreamOptions quick() {
  stream::StreamOptions o;
  o.keepalive = 50ms;
  o.peer_timeout = 400ms;
  o.linger = 100ms;
  o.connect_timeout = 2000ms;
  return o;
}

struct Link {
  std::unique_ptr<stream::Stream> client, server;
  uint32_t client_qp = 0, server_qp = 0;
};

// A stream from `client` to the listener, and which fake QP carries each end.
Link connect(stream::Engine& client, stream::StreamListener& l,
             const stream::StreamOptions& o) {
  const auto before = live_qps();
  Link k;
  std::thread t([&] { k.server = l.accept(2000ms, o); });
  k.client = client.connect(l.address(), o);
  t.join();
  std::vector<uint32_t> added;
  for (uint32_t q : live_qps()) {
    if (std::find(before.begin(), before.end(), q) == before.end()) added.push_back(q);
  }
  EXPECT_EQ(added.size(), 2u);
  if (added.size() == 2) {
    k.client_qp = added[0];  // the connecting side's QP is made first
    k.server_qp = added[1];
  }
  return k;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

// Sends `data` on `w` and reads it back on `r` (a writer thread), bounded.
bool transfer(stream::Stream& w, stream::Stream& r, const std::vector<uint8_t>& data) {
  w.set_timeouts(5000ms, 5000ms);
  r.set_timeouts(5000ms, 5000ms);
  std::thread t(
      [&] { EXPECT_EQ(w.write(data.data(), data.size()), ssize_t(data.size())); });
  std::vector<uint8_t> got(data.size());
  const ssize_t n = r.read(got.data(), got.size(), stream::Stream::kWaitAll);
  t.join();
  return n == ssize_t(data.size()) && got == data;
}

struct Engines {
  Scope scope;
  std::shared_ptr<stream::Engine> server = stream::Engine::create();
  std::shared_ptr<stream::Engine> client = stream::Engine::create();
  std::unique_ptr<stream::StreamListener> listener =
      server->listen("127.0.0.1:0", quick());
};

// Mechanism: the stream's own peer timeout (keepalives and the timer that
// declares a peer silent). The client's process stops: its QP neither sends
// nor sees anything, but the transport does not fail it (the fake keeps a
// stopped peer's QP up, as a NIC does). The server's blocked read must end
// with ETIMEDOUT after peer_timeout, not wait forever.
TEST(FakeStream, ASilentPeerEndsABlockedReadWithEtimedout) {
  Engines e;
  Link k = connect(*e.client, *e.listener, quick());
  ASSERT_TRUE(transfer(*k.client, *k.server, pattern(1000, 1)));
  freeze(k.client_qp);
  k.server->set_timeouts(5000ms, 5000ms);
  char c = 0;
  const auto t0 = Clock::now();
  const ssize_t n = k.server->read(&c, 1);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(n, -ETIMEDOUT) << "read returned " << n;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3000ms);
  EXPECT_EQ(k.server->error(), ETIMEDOUT);
  thaw(k.client_qp);
}

// Mechanism: a peer death reaches the stream through its QP's error
// completions. The client dies after a few of its data requests have gone
// out in the middle of a transfer, and the transport learns it in 50 ms
// (the stream's own peer timeout is 2 s): the server reads what arrived,
// then ECONNRESET, long before its own timer would have said ETIMEDOUT;
// never a hang, never a byte that was not sent.
TEST(FakeStream, APeerThatDiesMidTransferEndsTheReaderWithAnError) {
  Engines e;
  auto o = quick();
  o.peer_timeout = 2000ms;
  Link k = connect(*e.client, *e.listener, o);
  set_death_notice(50ms);
  const auto data = pattern(1 << 20, 3);
  kill_after(k.client_qp, 8);
  k.client->set_timeouts(3000ms, 3000ms);
  std::thread w([&] { (void)k.client->write(data.data(), data.size()); });
  k.server->set_timeouts(5000ms, 5000ms);
  std::vector<uint8_t> got(data.size());
  size_t have = 0;
  ssize_t n = 0;
  const auto t0 = Clock::now();
  while ((n = k.server->read(got.data() + have, got.size() - have)) > 0)
    have += static_cast<size_t>(n);
  const auto took = Clock::now() - t0;
  w.join();  // the dead side's own write ends at its peer timeout
  EXPECT_EQ(n, -ECONNRESET) << "read returned " << n;
  EXPECT_LT(took, 1500ms);
  EXPECT_LT(have, data.size());
  EXPECT_TRUE(
      std::equal(got.begin(), got.begin() + static_cast<long>(have), data.begin()));
}

// Mechanism: a send completion frees send-buffer space and updates the
// readiness fd. With the writer's send completions held back, a
// non-blocking writer fills its buffer and its fd stops showing POLLOUT;
// the moment they are delivered, POLLOUT comes back (the reader reads
// nothing meanwhile).
TEST(FakeStream, WritabilityReturnsWhenHeldSendCompletionsArrive) {
  Engines e;
  // Keepalives a second apart: no other message refreshes the fd meanwhile.
  auto o = quick();
  o.keepalive = 1000ms;
  o.peer_timeout = 4000ms;
  Link k = connect(*e.client, *e.listener, o);
  const uint32_t qp = k.client_qp;
  set_filter([qp](const Completion& c) {
    const bool send_side =
        c.opcode != Opcode::kRecv && c.opcode != Opcode::kRecvWriteWithImm;
    return c.qp_num == qp && send_side ? Verdict::kHold : Verdict::kDeliver;
  });
  k.client->set_nonblocking(true);
  const auto chunk = pattern(4096, 5);
  size_t wrote = 0;
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = k.client->write(chunk.data(), chunk.size());
    if (n == -EAGAIN) break;
    ASSERT_GT(n, 0);
    wrote += static_cast<size_t>(n);
  }
  ASSERT_GT(wrote, 0u);
  ASSERT_LT(wrote, 1000u * chunk.size()) << "writes never blocked";
  // A caller about to sleep on fd() says so (the engine then watches for
  // arrivals on its behalf), as the preload's waits do.
  pollfd p{k.client->fd(), POLLOUT, 0};
  EXPECT_FALSE(k.client->poll_readiness(/*about_to_sleep=*/true) & POLLOUT);
  EXPECT_EQ(::poll(&p, 1, 100), 0) << "writable with every send buffer byte in flight";
  set_filter(nullptr);
  EXPECT_GT(release_held(), 0u);
  const auto t0 = Clock::now();
  EXPECT_EQ(::poll(&p, 1, 300), 1);
  EXPECT_LT(Clock::now() - t0, 100ms);
  EXPECT_TRUE(p.revents & POLLOUT);
  // Everything written arrives, in order.
  std::vector<uint8_t> got(wrote);
  k.server->set_timeouts(5000ms, 5000ms);
  ASSERT_EQ(k.server->read(got.data(), got.size(), stream::Stream::kWaitAll),
            ssize_t(wrote));
  for (size_t off = 0; off < wrote; off += chunk.size())
    ASSERT_EQ(
        std::memcmp(got.data() + off, chunk.data(), std::min(chunk.size(), wrote - off)),
        0);
}

// Mechanism: completions are routed by slot and checked against the
// slot's generation. A stream goes away with a send completion still to
// come; its slot is taken by a new stream; then the old completion
// arrives. It must be dropped: applied to the new stream it would retire a
// send and free buffer bytes that are not its own.
TEST(FakeStream, ALateCompletionOfADestroyedStreamIsNotAppliedToItsSuccessor) {
  Engines e;
  Link a = connect(*e.client, *e.listener, quick());
  const uint32_t qp = a.client_qp;
  set_filter([qp](const Completion& c) {
    return c.qp_num == qp && c.ok() && c.opcode != Opcode::kRecv &&
                   c.opcode != Opcode::kRecvWriteWithImm
               ? Verdict::kHold
               : Verdict::kDeliver;
  });
  const auto first = pattern(8192, 9);
  ASSERT_EQ(a.client->write(first.data(), first.size()), ssize_t(first.size()));
  const auto until = Clock::now() + 2000ms;
  while (held_count() == 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_GT(held_count(), 0u);
  (void)a.client->abort();
  a.client.reset();
  a.server.reset();
  // The old stream's QP is destroyed once its linger ends.
  while (Clock::now() < until + 2000ms) {
    const auto live = live_qps();
    if (std::find(live.begin(), live.end(), qp) == live.end()) break;
    std::this_thread::sleep_for(5ms);
  }
  const auto live = live_qps();
  ASSERT_EQ(std::find(live.begin(), live.end(), qp), live.end()) << "old QP still alive";
  Link b = connect(*e.client, *e.listener, quick());
  set_filter(nullptr);
  ASSERT_GT(release_held(), 0u);
  for (uint8_t round = 0; round < 4; ++round) {
    ASSERT_TRUE(transfer(*b.client, *b.server, pattern(300000, round)))
        << "round " << +round;
    ASSERT_TRUE(transfer(*b.server, *b.client, pattern(300000, round + 50)))
        << "round " << +round;
  }
  EXPECT_EQ(b.client->error(), 0);
}

// Completions of two streams on one engine's shared CQ arrive reordered
// across the two QPs (verbs keeps order only within a QP): both streams
// still deliver every byte in order.
TEST(FakeStream, CompletionsReorderedAcrossStreamsKeepEachStreamsOrder) {
  Engines e;
  Link s1 = connect(*e.client, *e.listener, quick());
  Link s2 = connect(*e.client, *e.listener, quick());
  set_filter(
      [](const Completion& c) { return c.ok() ? Verdict::kHold : Verdict::kDeliver; });
  const auto d1 = pattern(20000, 11), d2 = pattern(20000, 13);
  std::thread w1(
      [&] { EXPECT_EQ(s1.client->write(d1.data(), d1.size()), ssize_t(d1.size())); });
  std::thread w2(
      [&] { EXPECT_EQ(s2.client->write(d2.data(), d2.size()), ssize_t(d2.size())); });
  std::vector<uint8_t> g1(d1.size()), g2(d2.size());
  size_t h1 = 0, h2 = 0;
  const auto until = Clock::now() + 5000ms;
  while ((h1 < g1.size() || h2 < g2.size()) && Clock::now() < until) {
    std::this_thread::sleep_for(2ms);
    release_held(/*reverse_qps=*/true);
    ssize_t n =
        s1.server->read(g1.data() + h1, g1.size() - h1, stream::Stream::kDontWait);
    if (n > 0) h1 += static_cast<size_t>(n);
    n = s2.server->read(g2.data() + h2, g2.size() - h2, stream::Stream::kDontWait);
    if (n > 0) h2 += static_cast<size_t>(n);
  }
  set_filter(nullptr);
  release_held();
  w1.join();
  w2.join();
  EXPECT_EQ(g1, d1);
  EXPECT_EQ(g2, d2);
}

}  // namespace
}  // namespace rdmakit::fake
