// What a hostile peer can hold in the tcp provider, each bounded by local
// configuration: a deregistration (trickling WRITE, slow READ reader), memory
// sized by its HELLO, handshake slots (silent connections) and timers (tiny
// peer_timeout, huge rnr_timeout). The peers are hand-made: raw sockets
// speaking the wire format of src/providers/tcp/tcp_wire.hpp.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "providers/tcp/tcp_provider.hpp"
#include "rdmakit/rdmakit.hpp"

namespace rdmakit::tcp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

QpOptions opts(CompletionQueue* cq, std::chrono::milliseconds peer_timeout = 1000ms) {
  QpOptions o;
  o.send_cq = o.recv_cq = cq;
  o.max_send_wr = o.max_recv_wr = 16;
  o.rnr_timeout = 300ms;
  o.peer_timeout = peer_timeout;
  return o;
}

bool send_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool put_frame(int fd, WireOp op, uint64_t seq, uint32_t len = 0, uint64_t addr = 0,
               uint32_t rkey = 0, uint64_t arg0 = 0) {
  Header h;
  h.op = op;
  h.seq = seq;
  h.length = len;
  h.addr = addr;
  h.rkey = rkey;
  h.arg0 = arg0;
  std::byte b[kHeaderSize];
  encode_header(h, b);
  return send_all(fd, b, sizeof b);
}

// Counts the QP's frames of kind `op` for `t` (payloads skipped); *first
// gets the first such header. Stops early at EOF or once `stop_at` are seen.
int count_frames(int fd, std::chrono::milliseconds t, WireOp op, Header* first = nullptr,
                 int stop_at = 1 << 30) {
  std::vector<std::byte> buf;
  int n = 0;
  const auto end = Clock::now() + t;
  while (Clock::now() < end && n < stop_at) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5) <= 0) continue;
    std::byte tmp[65536];
    const ssize_t r = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (r < 0) continue;
    buf.insert(buf.end(), tmp, tmp + r);
    while (buf.size() >= kHeaderSize) {
      const auto h =
          decode_header(std::span<const std::byte, kHeaderSize>(buf.data(), kHeaderSize));
      if (!h || buf.size() < kHeaderSize + h->length) break;
      buf.erase(buf.begin(),
                buf.begin() + static_cast<ptrdiff_t>(kHeaderSize + h->length));
      if (h->op == op && n++ == 0 && first != nullptr) *first = *h;
    }
  }
  return n;
}

// Two hosts (tests/tcp/netns_test.sh hostile): the listening side lives in
// namespace RDMAKIT_TCP_SERVER_NETNS at RDMAKIT_TCP_SERVER_HOST, the peers
// in ours. Default: both on loopback.
std::string server_host() {
  const char* h = std::getenv("RDMAKIT_TCP_SERVER_HOST");
  return h != nullptr ? h : "127.0.0.1";
}

// The listening socket is created by a thread that entered the server's
// namespace (setns is per thread); the socket stays in it.
std::unique_ptr<Listener> listen_server(Context& ctx) {
  const char* ns = std::getenv("RDMAKIT_TCP_SERVER_NETNS");
  if (ns == nullptr) return ctx.listen(server_host() + ":0");
  std::unique_ptr<Listener> l;
  std::string err;
  std::thread t([&] {
    const int fd = ::open(("/var/run/netns/" + std::string(ns)).c_str(), O_RDONLY);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      err = std::string("cannot enter netns ") + ns + ": " + std::strerror(errno);
    } else {
      l = ctx.listen(server_host() + ":0");
    }
    if (fd >= 0) ::close(fd);
  });
  t.join();
  if (l == nullptr) ADD_FAILURE() << err;
  return l;
}

long rss_kib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

std::vector<std::byte> hello_frame(const Hello& h) {
  std::vector<std::byte> f(kHeaderSize + kHelloBodySize);
  Header hdr;
  hdr.length = kHelloBodySize;
  encode_header(hdr, f.data());
  f[0] = static_cast<std::byte>(WireOp::kHello);
  encode_hello(h, f.data() + kHeaderSize);
  return f;
}

int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, server_host().c_str(), &sa.sin_addr);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A hand-made peer on a real TCP connection: it connects, sends `hello`
// and reads our answer; from then on the test writes its frames by hand.
struct RawPeer {
  std::unique_ptr<QueuePair> qp;  // our side
  int fd = -1;                    // the peer's socket
  ~RawPeer() {
    qp.reset();
    if (fd >= 0) ::close(fd);
  }
};

void make_raw_peer(Listener& lis, const QpOptions& o, const Hello& hello, RawPeer* p) {
  p->fd = raw_connect(lis.port());
  ASSERT_GE(p->fd, 0);
  const auto frame = hello_frame(hello);
  ASSERT_TRUE(send_all(p->fd, frame.data(), frame.size()));
  p->qp = lis.accept(o, 3s, {});
  std::byte answer[kHeaderSize + kHelloBodySize];
  size_t got = 0;
  while (got < sizeof answer) {
    const ssize_t r = ::recv(p->fd, answer + got, sizeof answer - got, 0);
    ASSERT_GT(r, 0);
    got += static_cast<size_t>(r);
  }
}

// ------------------------------------------------ 1. deregistration

// The peer starts a 64 KiB WRITE into our region and then trickles its
// payload, one byte every 50 ms, for up to 5 s. Destroying the region must
// not wait for it: after the QP's peer_timeout (300 ms) that transfer is cut.
TEST(TcpHostileLimits, TricklingWriteDoesNotHoldDeregistration) {
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto lis = listen_server(ctx);
  ASSERT_NE(lis, nullptr);
  RawPeer peer;
  make_raw_peer(*lis, opts(cq.get(), 300ms), Hello{16, 16, 100, 300, 0}, &peer);
  auto& qp = peer.qp;
  const int fd = peer.fd;
  auto mr = ctx.allocate(1 << 16, kAccessAll);
  ASSERT_TRUE(put_frame(fd, WireOp::kWrite, 0, 1 << 16,
                        reinterpret_cast<uint64_t>(mr->data()), mr->rkey()));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const auto end = Clock::now() + 5s;
    while (!stop.load() && Clock::now() < end) {
      if (!send_all(fd, "x", 1)) break;
      std::this_thread::sleep_for(50ms);
    }
  });
  std::this_thread::sleep_for(200ms);  // the WRITE is under way, its region pinned
  const auto t0 = Clock::now();
  mr.reset();
  const int64_t took = ms_since(t0);
  stop = true;
  trickle.join();
  std::printf("[ measure ] deregistration under a trickling WRITE: %lld ms\n",
              static_cast<long long>(took));
  EXPECT_LT(took, 1500) << "deregistration waited for the trickling peer";
  EXPECT_EQ(qp->state(), QpState::kError) << "the transfer was not cut";
}

// The peer asks for a 64 MiB READ and reads the response slowly (64 KiB
// every 50 ms) while sending heartbeats, so it never looks silent.
TEST(TcpHostileLimits, SlowReadReaderDoesNotHoldDeregistration) {
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto lis = listen_server(ctx);
  ASSERT_NE(lis, nullptr);
  RawPeer peer;
  make_raw_peer(*lis, opts(cq.get(), 300ms), Hello{16, 16, 100, 300, 0}, &peer);
  auto& qp = peer.qp;
  const int fd = peer.fd;
  // Larger than the socket buffers of both ends can take (autotuned to a
  // few MiB each): the response cannot leave without the peer reading.
  constexpr uint32_t kLen = 64u << 20;
  auto mr = ctx.allocate(kLen, kAccessAll);
  ASSERT_TRUE(put_frame(fd, WireOp::kReadReq, 0, 0,
                        reinterpret_cast<uint64_t>(mr->data()), mr->rkey(), kLen));
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    const auto end = Clock::now() + 5s;
    std::vector<std::byte> tmp(64 << 10);
    while (!stop.load() && Clock::now() < end) {
      if (!put_frame(fd, WireOp::kHeartbeat, 0)) break;
      if (::recv(fd, tmp.data(), tmp.size(), MSG_DONTWAIT) == 0) break;
      std::this_thread::sleep_for(50ms);
    }
  });
  std::this_thread::sleep_for(200ms);
  const auto t0 = Clock::now();
  mr.reset();
  const int64_t took = ms_since(t0);
  stop = true;
  reader.join();
  std::printf("[ measure ] deregistration under a slow READ reader: %lld ms\n",
              static_cast<long long>(took));
  EXPECT_LT(took, 1500) << "deregistration waited for the slow reader";
  EXPECT_EQ(qp->state(), QpState::kError) << "the transfer was not cut";
}

// ------------------------------------------------ 2. memory from a HELLO

// Peers whose HELLO asks for the deepest queues the wire allows (65536
// requests in flight): the server's memory per connection is set by its own
// depths (16 here), not by theirs. Before: ~5.6 MB per connection.
TEST(TcpHostileLimits, OversizedHelloDepthsDoNotSizeOurMemory) {
  TcpContext ctx(true);
  CqOptions co;
  co.capacity = 4096;
  auto cq = ctx.create_cq(co);
  auto lis = listen_server(ctx);
  ASSERT_NE(lis, nullptr);
  constexpr int kConns = 16;
  const auto frame = hello_frame(Hello{kMaxWr, kMaxWr, 1000, 1000, 0});
  std::vector<int> fds;
  std::vector<std::unique_ptr<QueuePair>> qps;
  const long before = rss_kib();
  for (int i = 0; i < kConns; ++i) {
    const int fd = raw_connect(lis->port());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    ASSERT_TRUE(send_all(fd, frame.data(), frame.size()));
    qps.push_back(lis->accept(opts(cq.get()), 3s, {}));
  }
  const long per_conn = (rss_kib() - before) / kConns;
  std::printf("[ measure ] RSS per connection, peer asks for depth %u: %ld KiB\n", kMaxWr,
              per_conn);
  EXPECT_LT(per_conn, 512) << "a peer's HELLO sized our memory";
  qps.clear();
  for (int fd : fds) ::close(fd);
}

// ------------------------------------------------ 3. handshake slots

// 100 connections that never say HELLO are open when a genuine client
// connects: it must be accepted promptly (before: 1 s per silent client,
// one after another, so it timed out).
TEST(TcpHostileLimits, SilentConnectionsDoNotStarveGenuineClients) {
  TcpContext sctx(true), cctx(true);
  auto scq = sctx.create_cq(), ccq = cctx.create_cq();
  auto lis = listen_server(sctx);
  ASSERT_NE(lis, nullptr);
  std::vector<int> silent;
  for (int i = 0; i < 100; ++i) {
    const int fd = raw_connect(lis->port());
    ASSERT_GE(fd, 0) << i;
    silent.push_back(fd);
  }
  std::unique_ptr<QueuePair> sqp, cqp;
  std::thread server([&] {
    try {
      sqp = lis->accept(opts(scq.get()), 8s, {});
    } catch (const Error&) {
    }
  });
  std::this_thread::sleep_for(100ms);  // the silent ones are accepted first
  const auto t0 = Clock::now();
  try {
    cqp = cctx.connect(server_host() + ":" + std::to_string(lis->port()), opts(ccq.get()),
                       {}, 6s);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  const int64_t took = ms_since(t0);
  server.join();
  std::printf("[ measure ] genuine connect with 100 silent connections open: %lld ms\n",
              static_cast<long long>(took));
  EXPECT_NE(cqp, nullptr);
  EXPECT_NE(sqp, nullptr);
  EXPECT_LT(took, 2000) << "silent connections delayed a genuine client";
  for (int fd : silent) ::close(fd);
}

// A client that stalls mid-handshake (half a HELLO header, then nothing)
// while the server polls accept() with 1 ms timeouts, as an event loop
// does: a genuine client connecting after it is accepted promptly, and the
// stalled one is neither answered nor reported as a connection.
TEST(TcpHostileLimits, ClientStalledMidHandshakeDoesNotHoldShortAcceptPolls) {
  TcpContext sctx(true), cctx(true);
  auto scq = sctx.create_cq(), ccq = cctx.create_cq();
  auto lis = listen_server(sctx);
  ASSERT_NE(lis, nullptr);
  const int stalled = raw_connect(lis->port());
  ASSERT_GE(stalled, 0);
  const std::byte half[kHeaderSize / 2] = {static_cast<std::byte>(WireOp::kHello)};
  ASSERT_TRUE(send_all(stalled, half, sizeof half));
  std::atomic<bool> stop{false};
  std::unique_ptr<QueuePair> sqp;
  int polls = 0;
  std::thread server([&] {
    while (!sqp && !stop.load()) {
      ++polls;
      try {
        sqp = lis->accept(opts(scq.get()), 1ms, {});
      } catch (const Error& e) {
        if (e.sys_errno() != ETIMEDOUT) ADD_FAILURE() << e.what();
      }
    }
  });
  std::this_thread::sleep_for(50ms);  // the stalled one is taken first
  const auto t0 = Clock::now();
  std::unique_ptr<QueuePair> cqp;
  try {
    cqp = cctx.connect(server_host() + ":" + std::to_string(lis->port()), opts(ccq.get()),
                       {}, 5s);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  const int64_t took = ms_since(t0);
  stop.store(true);
  server.join();
  std::printf(
      "[ measure ] genuine connect beside a half HELLO, 1 ms accept polls: %lld ms "
      "(%d polls)\n",
      static_cast<long long>(took), polls);
  ASSERT_NE(cqp, nullptr);
  ASSERT_NE(sqp, nullptr);
  EXPECT_EQ(sqp->peer_private_data().size(), 0u);
  EXPECT_LT(took, 2000) << "a stalled handshake delayed a genuine client";
  ::close(stalled);
}

// ------------------------------------------------ 4. timers

// A HELLO with peer_timeout = 1 ms asked for a heartbeat every millisecond;
// it is clamped to the 100 ms floor: at most 40 heartbeats per second.
TEST(TcpHostileLimits, TinyPeerTimeoutDoesNotFloodHeartbeats) {
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto lis = listen_server(ctx);
  ASSERT_NE(lis, nullptr);
  RawPeer peer;
  make_raw_peer(*lis, opts(cq.get(), 5000ms), Hello{16, 16, 100, 1, 0}, &peer);
  auto& qp = peer.qp;
  const int fd = peer.fd;
  const int beats = count_frames(fd, 1000ms, WireOp::kHeartbeat);
  std::printf("[ measure ] heartbeats in 1 s, peer asked for peer_timeout 1 ms: %d\n",
              beats);
  EXPECT_LE(beats, 60) << "a tiny peer_timeout set our heartbeat rate";
  EXPECT_GE(beats, 5) << "heartbeats stopped";
  EXPECT_EQ(qp->state(), QpState::kConnected);
}

// A HELLO with rnr_timeout = 2^32-1 ms: a SEND with no RECV posted stalls
// the stream no longer than our own max(rnr_timeout, peer_timeout) (here
// 300 ms), then is NAKed RNR_RETRY_EXCEEDED.
TEST(TcpHostileLimits, HugeRnrTimeoutStallsABoundedTime) {
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto lis = listen_server(ctx);
  ASSERT_NE(lis, nullptr);
  RawPeer peer;
  make_raw_peer(*lis, opts(cq.get(), 300ms), Hello{16, 16, UINT32_MAX, 300, 0}, &peer);
  const int fd = peer.fd;
  const auto t0 = Clock::now();
  ASSERT_TRUE(put_frame(fd, WireOp::kSend, 0, 8));
  ASSERT_TRUE(send_all(fd, "12345678", 8));
  std::atomic<bool> stop{false};
  std::thread beat([&] {  // the peer is alive: only the stall is at stake
    while (!stop.load() && put_frame(fd, WireOp::kHeartbeat, 0))
      std::this_thread::sleep_for(50ms);
  });
  Header nak;
  const int naks = count_frames(fd, 3000ms, WireOp::kNak, &nak, 1);
  const int64_t took = ms_since(t0);
  stop = true;
  beat.join();
  ASSERT_EQ(naks, 1) << "the stall did not end";
  EXPECT_EQ(nak.status, Status::kRnrRetryExceeded);
  EXPECT_LT(took, 1500);
  EXPECT_GE(took, 250);
}

}  // namespace
}  // namespace rdmakit::tcp
