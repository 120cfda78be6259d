// tcp provider tests that need no second process: both ends live in this
// process (two contexts over loopback), plus white-box cases that drive a
// queue pair over a socketpair to play a silent or hostile peer.
#include "providers/tcp/tcp_provider.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::tcp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Side {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
};

QpOptions opts(CompletionQueue* cq) {
  QpOptions o;
  o.send_cq = cq;
  o.recv_cq = cq;
  o.rnr_timeout = 300ms;
  o.peer_timeout = 1000ms;
  return o;
}

// Both ends in one process; `b` is the acceptor.
struct Pair {
  Side a, b;
  explicit Pair(QpOptions oa_in = {}, QpOptions ob_in = {}, bool threads = true) {
    a.ctx = std::make_unique<TcpContext>(threads);
    b.ctx = std::make_unique<TcpContext>(threads);
    a.cq = a.ctx->create_cq();
    b.cq = b.ctx->create_cq();
    QpOptions oa = opts(a.cq.get()), ob = opts(b.cq.get());
    if (oa_in.send_cq == nullptr)
      oa_in = oa;
    else {
      oa_in.send_cq = oa_in.recv_cq = a.cq.get();
    }
    if (ob_in.send_cq == nullptr)
      ob_in = ob;
    else {
      ob_in.send_cq = ob_in.recv_cq = b.cq.get();
    }
    auto listener = b.ctx->listen("127.0.0.1:0");
    const std::string pd = "hello";
    std::thread t(
        [&] { b.qp = listener->accept(ob_in, 5s, std::as_bytes(std::span(pd))); });
    a.qp = a.ctx->connect("127.0.0.1:" + std::to_string(listener->port()), oa_in,
                          std::as_bytes(std::span(pd)));
    t.join();
  }
  ~Pair() {
    a.qp.reset();
    b.qp.reset();
  }
};

bool wait_one(CompletionQueue& cq, Completion* out, std::chrono::milliseconds t = 5s) {
  const auto end = Clock::now() + t;
  while (Clock::now() < end) {
    if (cq.poll({out, 1}) == 1) return true;
  }
  return false;
}

SendWr wr(Opcode op, uint64_t id, const MemoryRegion& mr, uint32_t len,
          const RemoteRegion* remote = nullptr, uint64_t roff = 0) {
  SendWr w;
  w.wr_id = id;
  w.opcode = op;
  w.flags = kSignaled;
  w.length = len;
  w.local_addr = mr.data();
  w.lkey = mr.lkey();
  if (remote != nullptr) {
    w.remote_addr = remote->addr + roff;
    w.rkey = remote->rkey;
  }
  return w;
}

TEST(TcpProvider, ConnectRefusedNamesProviderAndPeer) {
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto l = ctx.listen("127.0.0.1:0");
  const uint16_t port = l->port();
  l.reset();
  try {
    ctx.connect("127.0.0.1:" + std::to_string(port), opts(cq.get()), {}, 2s);
    FAIL() << "connect succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), ECONNREFUSED);
    EXPECT_NE(std::string(e.what()).find("tcp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(TcpProvider, SendRecvWriteReadAtomics) {
  Pair p;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p.b.qp->peer_private_data().data()),
                        p.b.qp->peer_private_data().size()),
            "hello");
  auto amr = p.a.ctx->allocate(1 << 20, kAccessAll);
  auto bmr = p.b.ctx->allocate(1 << 20, kAccessAll);
  const RemoteRegion br = bmr->remote();
  // SEND with imm into a posted RECV.
  RecvWr r{7, bmr->data(), 4096, bmr->lkey()};
  ASSERT_TRUE(p.b.qp->post_recv(r).ok());
  std::memcpy(amr->data(), "ping", 4);
  SendWr s = wr(Opcode::kSendWithImm, 1, *amr, 4);
  s.imm = 0xabcd;
  ASSERT_TRUE(p.a.qp->post_send(s).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*p.b.cq, &c));
  EXPECT_EQ(c.wr_id, 7u);
  EXPECT_EQ(c.opcode, Opcode::kRecv);
  EXPECT_EQ(c.byte_len, 4u);
  EXPECT_TRUE(c.has_imm());
  EXPECT_EQ(c.imm, 0xabcdu);
  EXPECT_EQ(std::memcmp(bmr->data(), "ping", 4), 0);
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.wr_id, 1u);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(c.opcode, Opcode::kSendWithImm);

  // 1 MiB WRITE then READ back into another part of a.
  for (size_t i = 0; i < 512 * 1024; ++i) amr->data()[i] = std::byte(i * 7);
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kWrite, 2, *amr, 512 * 1024, &br)).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_TRUE(c.ok()) << status_name(c.status);
  EXPECT_EQ(std::memcmp(bmr->data(), amr->data(), 512 * 1024), 0);
  SendWr rd = wr(Opcode::kRead, 3, *amr, 512 * 1024, &br);
  rd.local_addr = amr->data() + 512 * 1024;
  ASSERT_TRUE(p.a.qp->post_send(rd).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(c.opcode, Opcode::kRead);
  EXPECT_EQ(std::memcmp(amr->data() + 512 * 1024, amr->data(), 512 * 1024), 0);

  // WRITE_WITH_IMM: byte_len = bytes written.
  ASSERT_TRUE(p.b.qp->post_recv(RecvWr{8, nullptr, 0, 0}).ok());
  SendWr wi = wr(Opcode::kWriteWithImm, 4, *amr, 100, &br, 4096);
  wi.imm = 42;
  ASSERT_TRUE(p.a.qp->post_send(wi).ok());
  ASSERT_TRUE(wait_one(*p.b.cq, &c));
  EXPECT_EQ(c.opcode, Opcode::kRecvWriteWithImm);
  EXPECT_EQ(c.byte_len, 100u);
  EXPECT_EQ(c.imm, 42u);
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_TRUE(c.ok());

  // Atomics.
  uint64_t v = 10;
  std::memcpy(bmr->data() + 8192, &v, 8);
  SendWr fa = wr(Opcode::kFetchAdd, 5, *amr, 8, &br, 8192);
  fa.compare_add = 5;
  ASSERT_TRUE(p.a.qp->post_send(fa).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  uint64_t old;
  std::memcpy(&old, amr->data(), 8);
  EXPECT_EQ(old, 10u);
  SendWr cas = wr(Opcode::kCompareSwap, 6, *amr, 8, &br, 8192);
  cas.compare_add = 15;
  cas.swap = 99;
  ASSERT_TRUE(p.a.qp->post_send(cas).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  std::memcpy(&old, amr->data(), 8);
  EXPECT_EQ(old, 15u);
  std::memcpy(&v, bmr->data() + 8192, 8);
  EXPECT_EQ(v, 99u);
}

TEST(TcpProvider, AccessErrorFlushesAndLeavesTargetUntouched) {
  Pair p;
  auto amr = p.a.ctx->allocate(8192, kAccessAll);
  auto bmr = p.b.ctx->allocate(8192, kAccessRemoteRead | kAccessLocalWrite);
  RemoteRegion br = bmr->remote();
  std::memset(amr->data(), 0x5a, 8192);
  // WRITE to a read-only region, then a READ that would be fine.
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kWrite, 1, *amr, 64, &br)).ok());
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kRead, 2, *amr, 64, &br)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.status, Status::kRemoteAccessError);
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.status, Status::kWrFlushError);
  EXPECT_EQ(p.a.qp->state(), QpState::kError);
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(bmr->data()[i], std::byte{0});
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kWrite, 3, *amr, 64, &br)).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.status, Status::kWrFlushError);
}

TEST(TcpProvider, DeregisteredRegionFails) {
  Pair p;
  auto amr = p.a.ctx->allocate(4096, kAccessAll);
  auto bmr = p.b.ctx->allocate(4096, kAccessAll);
  const RemoteRegion br = bmr->remote();
  bmr.reset();
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kRead, 1, *amr, 64, &br)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.status, Status::kRemoteAccessError);
}

TEST(TcpProvider, RnrAndLengthError) {
  Pair p;
  auto amr = p.a.ctx->allocate(4096, kAccessAll);
  auto bmr = p.b.ctx->allocate(4096, kAccessAll);
  const auto start = Clock::now();
  ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kSend, 1, *amr, 16)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_EQ(c.status, Status::kRnrRetryExceeded);
  EXPECT_GE(Clock::now() - start, 250ms);

  Pair q;
  auto amr2 = q.a.ctx->allocate(4096, kAccessAll);
  auto bmr2 = q.b.ctx->allocate(4096, kAccessAll);
  ASSERT_TRUE(q.b.qp->post_recv(RecvWr{9, bmr2->data(), 8, bmr2->lkey()}).ok());
  ASSERT_TRUE(q.a.qp->post_send(wr(Opcode::kSend, 1, *amr2, 16)).ok());
  ASSERT_TRUE(wait_one(*q.b.cq, &c));
  EXPECT_EQ(c.status, Status::kLocalLengthError);
  ASSERT_TRUE(wait_one(*q.a.cq, &c));
  EXPECT_EQ(c.status, Status::kRemoteInvalidRequestError);
}

TEST(TcpProvider, SelectiveSignalingSlotRule) {
  QpOptions o;
  o.send_cq = reinterpret_cast<CompletionQueue*>(1);  // replaced by Pair
  o.max_send_wr = 4;
  o.rnr_timeout = 300ms;
  o.peer_timeout = 1000ms;
  Pair p(o, {});
  auto amr = p.a.ctx->allocate(4096, kAccessAll);
  auto bmr = p.b.ctx->allocate(4096, kAccessAll);
  const RemoteRegion br = bmr->remote();
  SendWr w = wr(Opcode::kWrite, 1, *amr, 8, &br);
  w.flags = 0;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.a.qp->post_send(w).ok());
  EXPECT_EQ(p.a.qp->post_send(w).status, PostStatus::kQueueFull);
  std::this_thread::sleep_for(100ms);
  Completion c;
  EXPECT_EQ(p.a.cq->poll({&c, 1}), 0);
  EXPECT_EQ(p.a.qp->post_send(w).status, PostStatus::kQueueFull);
}

TEST(TcpProvider, PeerDestroyedCompletesOutstanding) {
  Pair p;
  auto amr = p.a.ctx->allocate(4096, kAccessAll);
  ASSERT_TRUE(p.a.qp->post_recv(RecvWr{1, amr->data(), 64, amr->lkey()}).ok());
  p.b.qp.reset();
  Completion c;
  ASSERT_TRUE(wait_one(*p.a.cq, &c, 3s));
  EXPECT_EQ(c.status, Status::kWrFlushError);
  EXPECT_EQ(p.a.qp->state(), QpState::kError);
}

// Without progress threads the pollers alone move everything: the busy-poll
// path needs no thread hop.
TEST(TcpProvider, PollPathAloneMakesProgress) {
  Pair p({}, {}, /*threads=*/false);
  auto amr = p.a.ctx->allocate(1 << 20, kAccessAll);
  auto bmr = p.b.ctx->allocate(1 << 20, kAccessAll);
  const RemoteRegion br = bmr->remote();
  std::memset(amr->data(), 0x77, 1 << 20);
  std::atomic<bool> stop{false};
  std::thread target([&] {
    Completion c;
    while (!stop.load()) p.b.cq->poll({&c, 1});
  });
  Completion c;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(p.a.qp->post_send(wr(Opcode::kWrite, i, *amr, 1 << 20, &br)).ok());
    ASSERT_TRUE(wait_one(*p.a.cq, &c));
    EXPECT_TRUE(c.ok()) << status_name(c.status);
  }
  SendWr rd = wr(Opcode::kRead, 9, *amr, 4096, &br);
  rd.local_addr = amr->data() + 8192;
  ASSERT_TRUE(p.a.qp->post_send(rd).ok());
  ASSERT_TRUE(wait_one(*p.a.cq, &c));
  EXPECT_TRUE(c.ok());
  stop = true;
  target.join();
  EXPECT_EQ(bmr->data()[(1 << 20) - 1], std::byte{0x77});
}

// A killed peer process: outstanding requests and RECVs complete with errors
// promptly (the kernel closes its sockets), nothing hangs.
TEST(TcpProvider, KilledPeerProcess) {
  int port_pipe[2];
  ASSERT_EQ(::pipe(port_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The peer: its own context (created after fork), accepts and idles.
    ::close(port_pipe[0]);
    TcpContext ctx(true);
    auto cq = ctx.create_cq();
    auto l = ctx.listen("127.0.0.1:0");
    const uint16_t port = l->port();
    if (::write(port_pipe[1], &port, sizeof port) != sizeof port) ::_exit(2);
    auto qp = l->accept(opts(cq.get()), 10s);
    for (int i = 0; i < 1000; ++i) std::this_thread::sleep_for(10ms);
    ::_exit(0);
  }
  ::close(port_pipe[1]);
  uint16_t port = 0;
  ASSERT_EQ(::read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  ::close(port_pipe[0]);
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  auto qp = ctx.connect("127.0.0.1:" + std::to_string(port), opts(cq.get()));
  auto mr = ctx.allocate(4096, kAccessAll);
  ASSERT_TRUE(qp->post_recv(RecvWr{1, mr->data(), 64, mr->lkey()}).ok());
  ASSERT_TRUE(qp->post_send(wr(Opcode::kSend, 2, *mr, 16)).ok());  // RNR-stalled
  std::this_thread::sleep_for(50ms);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const auto start = Clock::now();
  Completion c[2];
  int got = 0;
  while (got < 2 && Clock::now() - start < 3s)
    got += cq->poll({c + got, size_t(2 - got)});
  ASSERT_EQ(got, 2);
  EXPECT_LT(Clock::now() - start, 500ms);
  for (const Completion& x : c) {
    EXPECT_FALSE(x.ok());
    const Status want = x.wr_id == 2 ? Status::kRetryExceeded : Status::kWrFlushError;
    EXPECT_EQ(x.status, want) << x.wr_id;
  }
  EXPECT_EQ(qp->state(), QpState::kError);
}

// A peer that handshook and then went silent (link cut): detected within
// peer_timeout plus a heartbeat period.
TEST(TcpProvider, SilentPeerDetected) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  QpOptions o = opts(cq.get());
  o.peer_timeout = 300ms;
  Hello peer{16, 16, 100, 300, 0};
  auto qp = ctx.adopt(sv[0], o, peer, "silent-peer");
  auto mr = ctx.allocate(4096, kAccessAll);
  const auto start = Clock::now();
  ASSERT_TRUE(qp->post_send(wr(Opcode::kRead, 1, *mr, 64, nullptr)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*cq, &c, 3s));
  const auto took = Clock::now() - start;
  EXPECT_EQ(c.status, Status::kRetryExceeded);
  EXPECT_EQ(c.vendor_err, uint32_t{ETIMEDOUT});
  // 300 ms + a heartbeat is ~400 ms; the bound leaves a loaded (or
  // TSan-slowed) machine room and stays well below the 2 s default timeout.
  EXPECT_LT(took, 1000ms);
  EXPECT_GE(took, 250ms);
  ::close(sv[1]);
}

// Garbage from the peer is a protocol error for that QP only.
TEST(TcpProvider, HostileHeaderEndsOnlyThatConnection) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  Hello peer{16, 16, 100, 1000, 0};
  auto qp = ctx.adopt(sv[0], opts(cq.get()), peer, "hostile-peer");
  auto mr = ctx.allocate(4096, kAccessAll);
  ASSERT_TRUE(qp->post_recv(RecvWr{5, mr->data(), 64, mr->lkey()}).ok());
  std::byte junk[kHeaderSize];
  std::memset(junk, 0xee, sizeof junk);
  ASSERT_EQ(::write(sv[1], junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
  Completion c;
  ASSERT_TRUE(wait_one(*cq, &c, 2s));
  EXPECT_EQ(c.status, Status::kWrFlushError);
  EXPECT_EQ(qp->state(), QpState::kError);
  ::close(sv[1]);
}

TEST(TcpProvider, AtomicsFromManyPeersAreAtomic) {
  TcpContext target(true);
  auto tcq = target.create_cq();
  auto counter = target.allocate(64, kAccessAll);
  const RemoteRegion rr = counter->remote();
  auto listener = target.listen("127.0.0.1:0");
  constexpr int kPeers = 4, kOps = 500;
  std::vector<std::unique_ptr<QueuePair>> accepted(kPeers);
  std::thread acc([&] {
    for (auto& q : accepted) q = listener->accept(opts(tcq.get()), 5s);
  });
  std::vector<std::thread> peers;
  std::atomic<int> failures{0};
  for (int i = 0; i < kPeers; ++i) {
    peers.emplace_back([&] {
      TcpContext ctx(true);
      auto cq = ctx.create_cq();
      auto qp =
          ctx.connect("127.0.0.1:" + std::to_string(listener->port()), opts(cq.get()));
      auto mr = ctx.allocate(64, kAccessAll);
      for (int k = 0; k < kOps; ++k) {
        SendWr w = wr(Opcode::kFetchAdd, k, *mr, 8, &rr);
        w.compare_add = 1;
        Completion c;
        if (!qp->post_send(w).ok() || !wait_one(*cq, &c) || !c.ok()) ++failures;
      }
    });
  }
  for (auto& t : peers) t.join();
  acc.join();
  EXPECT_EQ(failures.load(), 0);
  uint64_t v;
  std::memcpy(&v, counter->data(), 8);
  EXPECT_EQ(v, uint64_t{kPeers} * kOps);
}

// Keys are a secret permutation of (random tag, slot): every one of the 32
// bits varies across regions (the slot is not visible in the low half), and
// no key with a bit flipped names a live region.
TEST(TcpProvider, RkeysUseAllThirtyTwoBits) {
  TcpContext ctx(false);
  std::vector<std::byte> mem(4096);
  std::vector<std::unique_ptr<MemoryRegion>> mrs;
  uint32_t any = 0, all = ~0u;
  for (int i = 0; i < 256; ++i) {
    mrs.push_back(ctx.register_memory(mem.data(), mem.size(), kAccessAll));
    for (uint32_t k : {mrs.back()->rkey(), mrs.back()->lkey()}) {
      any |= k;
      all &= k;
    }
  }
  // For 512 random keys a bit stuck at 0 or 1 has probability 2^-511.
  EXPECT_EQ(any, ~0u) << std::hex << any;
  EXPECT_EQ(all, 0u) << std::hex << all;
  MrTable& t = ctx.progress()->mrs();
  for (const auto& mr : mrs) {
    const auto addr = reinterpret_cast<uint64_t>(mem.data());
    MrEntry* e = t.acquire(mr->rkey(), addr, 8, kAccessRemoteWrite);
    ASSERT_NE(e, nullptr);
    MrTable::release(e);
    for (int bit = 0; bit < 32; ++bit) {
      EXPECT_EQ(t.acquire(mr->rkey() ^ (1u << bit), addr, 8, kAccessRemoteWrite), nullptr)
          << "bit " << bit;
    }
  }
  // A reused slot gets a new key: the old one stays dead.
  const uint32_t old = mrs.front()->rkey();
  mrs.front() = ctx.register_memory(mem.data(), mem.size(), kAccessAll);
  mrs.erase(mrs.begin() + 1);
  auto again = ctx.register_memory(mem.data(), mem.size(), kAccessAll);
  EXPECT_NE(again->rkey(), old);
  EXPECT_EQ(t.acquire(old, reinterpret_cast<uint64_t>(mem.data()), 8, kAccessRemoteWrite),
            nullptr);
}

// A CQ must cover the depths of the QPs attached to it: checked when the QP
// is created (before connecting), never discovered later as lost completions.
TEST(TcpProvider, CqCapacityIsCheckedAgainstQueueDepths) {
  TcpContext ctx(true);
  auto small = ctx.create_cq({.capacity = 100});
  auto l = ctx.listen("127.0.0.1:0");
  QpOptions o = opts(small.get());
  o.max_send_wr = 64;
  o.max_recv_wr = 64;
  try {
    ctx.connect("127.0.0.1:" + std::to_string(l->port()), o, {}, 2s);
    FAIL() << "a CQ of 100 accepted a QP of 64 + 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
  }
}

// Every completion holds its queue slot until it is polled, so a CQ sized
// to the depths can never overrun: with the CQ full of unpolled RECV
// completions, posting more RECVs is refused (kQueueFull) instead of a
// later completion being dropped. Nothing is lost once the app polls.
TEST(TcpProvider, FullCqHoldsRecvSlotsUntilPolled) {
  TcpContext ca(true), cb(true);
  auto cqa = ca.create_cq();
  auto cqb = cb.create_cq({.capacity = 8});
  QpOptions oa = opts(cqa.get());
  QpOptions ob = opts(cqb.get());
  ob.max_send_wr = 4;
  ob.max_recv_wr = 4;
  auto listener = cb.listen("127.0.0.1:0");
  std::unique_ptr<QueuePair> qb;
  std::thread t([&] { qb = listener->accept(ob, 5s); });
  auto qa = ca.connect("127.0.0.1:" + std::to_string(listener->port()), oa);
  t.join();
  auto ma = ca.allocate(4096, kAccessAll);
  auto mb = cb.allocate(4096, kAccessAll);
  uint64_t next_recv = 0;
  auto post_recvs = [&](int n) {
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      const RecvWr r{next_recv, mb->data() + (next_recv % 8) * 64, 64, mb->lkey()};
      if (!qb->post_recv(r).ok()) break;
      ++next_recv;
      ++ok;
    }
    return ok;
  };
  ASSERT_EQ(post_recvs(4), 4);
  for (int i = 0; i < 4; ++i) {
    SendWr w = wr(Opcode::kSend, i, *ma, 16);
    w.flags = 0;
    ASSERT_TRUE(qa->post_send(w).ok());
  }
  // Let all four arrive (the progress thread serves b while nobody polls).
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(post_recvs(1), 0)
        << "a RECV slot was reused before its completion was polled";
  }
  Completion c[16];
  int got = 0;
  const auto end2 = Clock::now() + 3s;
  while (got < 4 && Clock::now() < end2) got += cqb->poll({c + got, size_t(16 - got)});
  ASSERT_EQ(got, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c[i].status, Status::kSuccess);
    EXPECT_EQ(c[i].wr_id, uint64_t(i));
  }
  EXPECT_EQ(post_recvs(4), 4) << "polled slots are free again";
  EXPECT_EQ(static_cast<TcpCq*>(cqb.get())->overflows(), 0u);
}

// A peer whose process is starved (here: no progress thread, nobody polls)
// for five peer_timeouts is slow, not dead: its kernel keeps acknowledging
// our heartbeats, so the connection survives and works afterwards.
TEST(TcpProvider, StarvedPeerIsNotDeclaredDead) {
  TcpContext fast(true), slow(false);
  auto fcq = fast.create_cq();
  auto scq = slow.create_cq();
  QpOptions fo = opts(fcq.get()), so = opts(scq.get());
  fo.peer_timeout = so.peer_timeout = 200ms;
  auto listener = slow.listen("127.0.0.1:0");
  std::unique_ptr<QueuePair> sq;
  std::thread t([&] { sq = listener->accept(so, 5s); });
  auto fq = fast.connect("127.0.0.1:" + std::to_string(listener->port()), fo);
  t.join();
  auto fm = fast.allocate(4096, kAccessAll);
  auto sm = slow.allocate(4096, kAccessAll);
  ASSERT_TRUE(sq->post_recv(RecvWr{7, sm->data(), 64, sm->lkey()}).ok());
  std::this_thread::sleep_for(1000ms);  // the slow side runs nothing at all
  EXPECT_EQ(fq->state(), QpState::kConnected)
      << "a live but starved peer was declared dead";
  std::memcpy(fm->data(), "still here", 10);
  ASSERT_TRUE(fq->post_send(wr(Opcode::kSend, 1, *fm, 10)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*scq, &c, 3s));
  EXPECT_EQ(c.status, Status::kSuccess);
  EXPECT_EQ(c.wr_id, 7u);
  EXPECT_EQ(std::memcmp(sm->data(), "still here", 10), 0);
  // The slow side has no progress thread: its ACK leaves while it polls.
  const auto end = Clock::now() + 3s;
  bool sent = false;
  while (!sent && Clock::now() < end) {
    Completion x;
    EXPECT_EQ(scq->poll({&x, 1}), 0);
    sent = fcq->poll({&c, 1}) == 1;
  }
  ASSERT_TRUE(sent);
  EXPECT_EQ(c.status, Status::kSuccess) << status_name(c.status);
  EXPECT_EQ(sq->state(), QpState::kConnected);
}

// SRQ specifics of this provider: QPs of another context are refused, an
// empty SRQ gives RNR_RETRY_EXCEEDED after rnr_timeout, and a RECV posted to
// the SRQ while a SEND is RNR-stalled is filled at once.
TEST(TcpProvider, SharedReceiveQueueRulesAndRnr) {
  TcpContext ca(true), cb(true), other(false);
  auto foreign = other.create_srq({.max_wr = 4});
  auto cqa = ca.create_cq();
  auto cqb = cb.create_cq();
  auto srq = cb.create_srq({.max_wr = 4});
  auto listener = cb.listen("127.0.0.1:0");
  QpOptions bad = opts(cqb.get());
  bad.srq = foreign.get();
  try {
    listener->accept(bad, 100ms);
    FAIL() << "an SRQ of another context was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("srq"), std::string::npos) << e.what();
  }
  QpOptions ob = opts(cqb.get());
  ob.srq = srq.get();
  std::unique_ptr<QueuePair> qb;
  std::thread t([&] { qb = listener->accept(ob, 5s); });
  auto qa = ca.connect("127.0.0.1:" + std::to_string(listener->port()), opts(cqa.get()));
  t.join();
  auto ma = ca.allocate(4096, kAccessAll);
  auto mb = cb.allocate(4096, kAccessAll);
  EXPECT_EQ(qb->post_recv(RecvWr{1, mb->data(), 64, mb->lkey()}).status,
            PostStatus::kInvalidArgument);
  // RNR stall, then a RECV posted to the SRQ releases it.
  ASSERT_TRUE(qa->post_send(wr(Opcode::kSend, 10, *ma, 32)).ok());
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(srq->post_recv(RecvWr{20, mb->data(), 64, mb->lkey()}).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*cqb, &c, 3s));
  EXPECT_EQ(c.status, Status::kSuccess);
  EXPECT_EQ(c.wr_id, 20u);
  EXPECT_EQ(c.qp_num, qb->qp_num());
  ASSERT_TRUE(wait_one(*cqa, &c, 3s));
  EXPECT_EQ(c.status, Status::kSuccess);
  // Nothing posted: RNR_RETRY_EXCEEDED after the initiator's rnr_timeout.
  const auto start = Clock::now();
  ASSERT_TRUE(qa->post_send(wr(Opcode::kSend, 11, *ma, 32)).ok());
  ASSERT_TRUE(wait_one(*cqa, &c, 3s));
  EXPECT_EQ(c.status, Status::kRnrRetryExceeded);
  EXPECT_GE(Clock::now() - start, 250ms);
  // The SRQ itself was not flushed by the failure: a RECV posted now stays
  // posted (the failed SEND consumed none).
  Completion none;
  EXPECT_EQ(cqb->poll({&none, 1}), 0);
}

// ---------------------------------------------------- review fixes (2026-11-23)

// White-box helpers: play the raw peer of an adopted QP over a socketpair.
void put_frame(int fd, WireOp op, uint64_t seq, uint32_t len = 0, uint64_t addr = 0,
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
  ASSERT_EQ(::write(fd, b, sizeof b), static_cast<ssize_t>(sizeof b));
}

// Reads the QP's frames (heartbeats skipped, payloads dropped) until one
// with op `until` arrives, EOF, or `t` passes. *eof says whether it closed.
std::vector<Header> read_frames(int fd, std::chrono::milliseconds t, WireOp until,
                                bool* eof = nullptr) {
  std::vector<Header> out;
  std::vector<std::byte> buf;
  if (eof != nullptr) *eof = false;
  const auto end = Clock::now() + t;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    std::byte tmp[65536];
    const ssize_t r = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      if (eof != nullptr) *eof = true;
      break;
    }
    if (r < 0) continue;
    buf.insert(buf.end(), tmp, tmp + r);
    while (buf.size() >= kHeaderSize) {
      const auto h =
          decode_header(std::span<const std::byte, kHeaderSize>(buf.data(), kHeaderSize));
      if (!h) return out;
      if (buf.size() < kHeaderSize + h->length) break;
      buf.erase(buf.begin(),
                buf.begin() + static_cast<ptrdiff_t>(kHeaderSize + h->length));
      if (h->op == WireOp::kHeartbeat) continue;
      out.push_back(*h);
      if (h->op == until) return out;
    }
  }
  return out;
}

SendWr bad_lkey_send(uint64_t id, const MemoryRegion& mr) {
  SendWr w = wr(Opcode::kSend, id, mr, 16);
  w.lkey = 12345;  // no such region: LOCAL_PROTECTION_ERROR, QP to error
  return w;
}

// Destroying a QP whose final ACK flush fails (peer gone): the flush that
// die() triggers must not push completions naming the dying QP (polling
// them touched freed memory).
TEST(TcpProviderReview, DestroyWithFailingFinalFlushPushesNothing) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(false);
  auto cq = ctx.create_cq();
  auto qp = ctx.adopt(sv[0], opts(cq.get()), Hello{16, 16, 100, 2000, 0}, "raw");
  auto mr = ctx.allocate(4096, kAccessAll);
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(qp->post_recv(RecvWr{i, mr->data(), 64, mr->lkey()}).ok());
  }
  put_frame(sv[1], WireOp::kSend, 0);
  Completion c;
  ASSERT_TRUE(wait_one(*cq, &c, 2s));  // the poll defers its ACK
  EXPECT_EQ(c.status, Status::kSuccess);
  ::close(sv[1]);  // the deferred ACK's send now fails with EPIPE
  qp.reset();
  Completion cs[8];
  EXPECT_EQ(cq->poll(cs), 0) << "a destroyed QP pushed completions";
  EXPECT_EQ(static_cast<TcpCq*>(cq.get())->overflows(), 0u);
}

// send_cq != recv_cq: a thread polling recv_cq drives the QP while it is
// destroyed. A send completion pushed after send_cq was scanned would name
// the freed QP (ASan catches it when polled). Timing-dependent: bounded to
// 300 QPs or 2 s; it caught the bug in most runs before the fix.
TEST(TcpProviderReview, DestroyWhileOtherCqIsPolled) {
  TcpContext ctx(false);
  auto scq = ctx.create_cq(), rcq = ctx.create_cq();
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    Completion c[4];
    while (!stop.load(std::memory_order_relaxed)) rcq->poll(c);
  });
  const auto end = Clock::now() + 2s;
  for (int it = 0; it < 300 && Clock::now() < end; ++it) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    QpOptions o = opts(scq.get());
    o.recv_cq = rcq.get();
    o.thread_safe = true;
    auto qp = ctx.adopt(sv[0], o, Hello{16, 16, 100, 2000, 0}, "raw");
    SendWr s;
    s.wr_id = static_cast<uint64_t>(it);
    s.opcode = Opcode::kSend;
    s.flags = kSignaled;
    ASSERT_TRUE(qp->post_send(s).ok());
    put_frame(sv[1], WireOp::kAck, 0);
    std::atomic<int> spin{(it * 37) % 4000};  // varies the race window
    while (spin.fetch_sub(1, std::memory_order_relaxed) > 0) {
    }
    qp.reset();
    Completion c[4];
    const int n = scq->poll(c);  // completions of a destroyed QP stay pollable
    for (int k = 0; k < n; ++k) EXPECT_EQ(c[k].wr_id, static_cast<uint64_t>(it));
    ::close(sv[1]);
  }
  stop = true;
  poller.join();
  EXPECT_EQ(static_cast<TcpCq*>(scq.get())->overflows(), 0u);
}

// A destroyed QP's unpolled completions stay charged against the CQ until
// polled: a new QP must not be admitted into room they still occupy.
TEST(TcpProviderReview, OrphanedCompletionsKeepCqCapacity) {
  TcpContext ctx(false);
  CqOptions co;
  co.capacity = 4;
  auto cq = ctx.create_cq(co);
  auto mr = ctx.allocate(4096, kAccessAll);
  QpOptions o = opts(cq.get());
  o.max_send_wr = 2;
  o.max_recv_wr = 2;
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  auto q1 = ctx.adopt(sv[0], o, Hello{16, 16, 100, 2000, 0}, "raw");
  for (uint64_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(q1->post_recv(RecvWr{100 + i, mr->data(), 64, mr->lkey()}).ok());
  }
  std::byte junk[kHeaderSize];
  std::memset(junk, 0xee, sizeof junk);
  ASSERT_EQ(::write(sv[1], junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
  EXPECT_EQ(cq->poll({}), 0);  // drives q1: protocol error, both RECVs flush
  q1.reset();
  ::close(sv[1]);
  // 2 orphaned entries + 4 new depths > 4: refused until some are polled.
  auto try_adopt = [&] {
    int s2[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, s2), 0);
    std::unique_ptr<QueuePair> q;
    try {
      q = ctx.adopt(s2[0], o, Hello{16, 16, 100, 2000, 0}, "raw");
    } catch (const Error& e) {
      EXPECT_EQ(e.sys_errno(), EINVAL);
      ::close(s2[0]);
    }
    ::close(s2[1]);
    return q != nullptr;
  };
  EXPECT_FALSE(try_adopt()) << "a QP was admitted into room held by unpolled entries";
  Completion c;
  ASSERT_EQ(cq->poll({&c, 1}), 1);
  EXPECT_EQ(c.wr_id, 100u);
  EXPECT_FALSE(try_adopt());
  ASSERT_EQ(cq->poll({&c, 1}), 1);
  EXPECT_EQ(c.wr_id, 101u);
  EXPECT_TRUE(try_adopt()) << "polled entries give their room back";
  EXPECT_EQ(static_cast<TcpCq*>(cq.get())->overflows(), 0u);
}

// The target enters the error state while a SEND's payload is arriving: the
// SEND must still be answered (NAK RETRY_EXCEEDED), not left unanswered or
// implicitly acknowledged by a later NAK.
TEST(TcpProviderReview, ErrorMidPayloadNaksThatRequest) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(false);  // driven by our polls only: deterministic
  auto cq = ctx.create_cq();
  auto qp = ctx.adopt(sv[0], opts(cq.get()), Hello{16, 16, 100, 2000, 0}, "raw");
  auto mr = ctx.allocate(1 << 20, kAccessAll);
  ASSERT_TRUE(qp->post_recv(RecvWr{7, mr->data(), 1 << 20, mr->lkey()}).ok());
  const uint32_t len = 100000;
  put_frame(sv[1], WireOp::kSend, 0, len);
  std::vector<std::byte> pay(len, std::byte{0x5a});
  ASSERT_EQ(::write(sv[1], pay.data(), 1000), 1000);
  EXPECT_EQ(cq->poll({}), 0);  // header and the first 1000 bytes taken
  ASSERT_TRUE(qp->post_send(bad_lkey_send(9, *mr)).ok());
  Completion cs[4];
  int n = 0;
  for (int i = 0; i < 100 && n < 2; ++i) n += cq->poll({cs + n, size_t(4 - n)});
  ASSERT_EQ(n, 2);
  EXPECT_EQ(cs[0].status, Status::kLocalProtectionError);
  EXPECT_EQ(cs[1].wr_id, 7u);
  EXPECT_EQ(cs[1].status, Status::kWrFlushError);
  const auto f = read_frames(sv[1], 1s, WireOp::kNak);
  ASSERT_FALSE(f.empty()) << "the SEND whose RECV was flushed got no response";
  EXPECT_EQ(f.back().op, WireOp::kNak);
  EXPECT_EQ(f.back().seq, 0u);
  EXPECT_EQ(f.back().status, Status::kRetryExceeded);
  ::close(sv[1]);
}

// Frames left in the staging buffer when one receive pass's budget ran out
// must be served at the progress thread's next fast tick, not at its
// heartbeat timer (here 1.25 s away).
TEST(TcpProviderReview, BudgetLeftoversAreServedPromptly) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  QpOptions o = opts(cq.get());
  o.max_send_wr = o.max_recv_wr = 256;
  o.peer_timeout = 10s;  // heartbeat timer every 1.25 s
  auto qp = ctx.adopt(sv[0], o, Hello{256, 256, 100, 10000, 0}, "raw");
  auto mr = ctx.allocate(4096, kAccessAll);
  std::vector<std::byte> buf;
  auto add = [&](WireOp op, uint64_t seq, uint32_t plen, uint64_t arg0) {
    Header h;
    h.op = op;
    h.seq = seq;
    h.length = plen;
    h.addr = reinterpret_cast<uint64_t>(mr->data());
    h.rkey = mr->rkey();
    h.arg0 = arg0;
    std::byte b[kHeaderSize];
    encode_header(h, b);
    buf.insert(buf.end(), b, b + kHeaderSize);
    buf.insert(buf.end(), plen, std::byte{1});
  };
  constexpr int kWrites = 150;  // ~3 budget steps each: two passes needed
  for (int i = 0; i < kWrites; ++i) add(WireOp::kWrite, i, 8, 0);
  add(WireOp::kReadReq, kWrites, 0, 8);
  ASSERT_LT(buf.size(), 16384u) << "must fit one staging read";
  const auto t0 = Clock::now();
  ASSERT_EQ(::write(sv[1], buf.data(), buf.size()), static_cast<ssize_t>(buf.size()));
  const auto f = read_frames(sv[1], 3s, WireOp::kReadResp);
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f.back().op, WireOp::kReadResp);
  EXPECT_LT(took, 300ms) << "staged frames waited for the heartbeat timer";
  ::close(sv[1]);
}

// Entering the error state while RNR-stalled ends the stall: peer-silence
// detection works again (a silent peer is caught after peer_timeout and the
// socket closed) and the QP no longer counts as stalled.
TEST(TcpProviderReview, ErrorWhileRnrStalledEndsTheStall) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TcpContext ctx(true);
  auto cq = ctx.create_cq();
  QpOptions o = opts(cq.get());
  o.peer_timeout = 300ms;
  o.rnr_timeout = 5000ms;  // caps the peer's: the stall must outlast the test
  auto qp = ctx.adopt(sv[0], o, Hello{16, 16, 5000, 300, 0}, "raw");  // rnr 5 s
  auto* tqp = static_cast<TcpQp*>(qp.get());
  auto mr = ctx.allocate(4096, kAccessAll);
  put_frame(sv[1], WireOp::kSend, 0, 8);
  ASSERT_EQ(::write(sv[1], "12345678", 8), 8);  // no RECV posted: stall
  const auto stall_end = Clock::now() + 2s;
  while (!tqp->rnr_stalled() && Clock::now() < stall_end)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(tqp->rnr_stalled());
  ASSERT_TRUE(qp->post_send(bad_lkey_send(9, *mr)).ok());
  Completion c;
  ASSERT_TRUE(wait_one(*cq, &c, 2s));
  EXPECT_EQ(c.status, Status::kLocalProtectionError);
  EXPECT_EQ(qp->state(), QpState::kError);
  // The raw peer stays silent: the QP must close the socket after ~300 ms.
  bool eof = false;
  read_frames(sv[1], 2s, WireOp::kHello, &eof);
  EXPECT_TRUE(eof) << "peer silence not detected after an error while stalled";
  EXPECT_FALSE(tqp->rnr_stalled());
  ::close(sv[1]);
}

// A silent client (connects, never says HELLO) costs accept() only a short
// handshake deadline; a well-behaved client behind it is still accepted.
TEST(TcpProviderReview, SilentClientDoesNotBlockAccept) {
  TcpContext sctx(true), cctx(true);
  auto scq = sctx.create_cq(), ccq = cctx.create_cq();
  auto lis = sctx.listen("127.0.0.1:0");
  const int idle = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(idle, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(lis->port());
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  std::unique_ptr<QueuePair> cqp;
  std::thread good([&] {
    try {
      cqp = cctx.connect("127.0.0.1:" + std::to_string(lis->port()), opts(ccq.get()), {},
                         4s);
    } catch (const Error&) {
    }
  });
  std::this_thread::sleep_for(50ms);  // the silent client is first in the queue
  std::unique_ptr<QueuePair> sqp;
  try {
    sqp = lis->accept(opts(scq.get()), 3s, {});
  } catch (const Error&) {
  }
  good.join();
  ::close(idle);
  EXPECT_NE(sqp, nullptr) << "accept spent its deadline on the silent client";
  EXPECT_NE(cqp, nullptr) << "the well-behaved client was refused";
}

}  // namespace
}  // namespace rdmakit::tcp
