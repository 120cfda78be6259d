// The fake provider itself: the verbs semantics protocol tests rely on, and
// each fault it can stage.
#include "fake_provider.hpp"

#include <gtest/gtest.h>
#include <poll.h>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>

namespace rdmakit::fake {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::unique_ptr<Context> a, b;
  std::unique_ptr<CompletionQueue> acq, bcq;
  std::unique_ptr<QueuePair> aqp, bqp;  // a connects, b accepts
  explicit Pair(std::chrono::milliseconds rnr = 200ms,
                std::chrono::milliseconds peer = 300ms) {
    a = Context::open();
    b = Context::open();
    acq = a->create_cq();
    bcq = b->create_cq();
    QpOptions o;
    o.rnr_timeout = rnr;
    o.peer_timeout = peer;
    o.send_cq = o.recv_cq = bcq.get();
    auto l = b->listen("127.0.0.1:0");
    std::thread t([&] { bqp = l->accept(o, 2000ms); });
    QpOptions oa = o;
    oa.send_cq = oa.recv_cq = acq.get();
    aqp = a->connect(l->address(), oa);
    t.join();
  }
};

Completion wait_one(CompletionQueue& cq, std::chrono::milliseconds limit = 2000ms) {
  Completion c;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (cq.poll({&c, 1}) == 1) return c;
    std::this_thread::sleep_for(1ms);
  }
  ADD_FAILURE() << "no completion within " << limit.count() << " ms";
  return c;
}

TEST(FakeProvider, SendWriteReadAndAtomicsMoveTheRightBytes) {
  Scope scope;
  Pair p;
  auto src = p.a->allocate(64, kAccessLocalWrite);
  auto dst = p.b->allocate(64, kAccessAll);
  std::memcpy(src->data(), "hello", 5);
  ASSERT_TRUE(p.bqp->post_recv(RecvWr{7, dst->data(), 64, dst->lkey()}).ok());
  SendWr s;
  s.wr_id = 1;
  s.opcode = Opcode::kSendWithImm;
  s.flags = kSignaled;
  s.length = 5;
  s.local_addr = src->data();
  s.lkey = src->lkey();
  s.imm = 42;
  ASSERT_TRUE(p.aqp->post_send(s).ok());
  Completion rc = wait_one(*p.bcq);
  EXPECT_EQ(rc.wr_id, 7u);
  EXPECT_EQ(rc.byte_len, 5u);
  EXPECT_TRUE(rc.has_imm());
  EXPECT_EQ(rc.imm, 42u);
  EXPECT_EQ(std::memcmp(dst->data(), "hello", 5), 0);
  EXPECT_EQ(wait_one(*p.acq).wr_id, 1u);

  SendWr w = s;
  w.opcode = Opcode::kWrite;
  w.remote_addr = dst->remote().addr + 8;
  w.rkey = dst->rkey();
  ASSERT_TRUE(p.aqp->post_send(w).ok());
  EXPECT_TRUE(wait_one(*p.acq).ok());
  EXPECT_EQ(std::memcmp(dst->data() + 8, "hello", 5), 0);

  SendWr f;
  f.wr_id = 3;
  f.opcode = Opcode::kFetchAdd;
  f.flags = kSignaled;
  f.length = 8;
  f.local_addr = src->data() + 16;
  f.lkey = src->lkey();
  f.remote_addr = dst->remote().addr + 32;
  f.rkey = dst->rkey();
  f.compare_add = 5;
  ASSERT_TRUE(p.aqp->post_send(f).ok());
  EXPECT_TRUE(wait_one(*p.acq).ok());
  uint64_t now = 0;
  std::memcpy(&now, dst->data() + 32, 8);
  EXPECT_EQ(now, 5u);
}

TEST(FakeProvider, SendWithoutRecvIsRnrAfterTheTimeout) {
  Scope scope;
  Pair p(100ms);
  std::array<char, 4> buf{};
  SendWr s;
  s.opcode = Opcode::kSend;
  s.flags = kSignaled | kInline;
  s.length = 4;
  s.local_addr = buf.data();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(p.aqp->post_send(s).ok());
  const Completion c = wait_one(*p.acq);
  EXPECT_EQ(c.status, Status::kRnrRetryExceeded) << status_name(c.status);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 90ms);
  EXPECT_EQ(p.aqp->state(), QpState::kError);
}

TEST(FakeProvider, ARecvPostedInTimeEndsTheRnrWait) {
  Scope scope;
  Pair p(1000ms);
  std::array<char, 4> buf{'a', 'b', 'c', 'd'}, in{};
  SendWr s;
  s.opcode = Opcode::kSend;
  s.flags = kSignaled | kInline;
  s.length = 4;
  s.local_addr = buf.data();
  ASSERT_TRUE(p.aqp->post_send(s).ok());
  buf[0] = 'x';  // inline: copied at post
  std::this_thread::sleep_for(20ms);
  auto mr = p.b->register_memory(in.data(), in.size(), kAccessLocalWrite);
  ASSERT_TRUE(p.bqp->post_recv(RecvWr{1, in.data(), 4, mr->lkey()}).ok());
  EXPECT_TRUE(wait_one(*p.acq).ok());
  EXPECT_TRUE(wait_one(*p.bcq).ok());
  EXPECT_EQ(std::memcmp(in.data(), "abcd", 4), 0);
}

TEST(FakeProvider, RefusedRecvsMakeAnRnrEvenWithRecvsPosted) {
  Scope scope;
  Pair p(50ms);
  std::array<char, 4> buf{}, in{};
  auto mr = p.b->register_memory(in.data(), in.size(), kAccessLocalWrite);
  ASSERT_TRUE(p.bqp->post_recv(RecvWr{1, in.data(), 4, mr->lkey()}).ok());
  refuse_recvs(p.bqp->qp_num(), 1);
  SendWr s;
  s.opcode = Opcode::kSend;
  s.flags = kSignaled | kInline;
  s.length = 4;
  s.local_addr = buf.data();
  ASSERT_TRUE(p.aqp->post_send(s).ok());
  EXPECT_EQ(wait_one(*p.acq).status, Status::kRnrRetryExceeded);
}

TEST(FakeProvider, BadRkeyIsARemoteAccessErrorAndLaterRequestsFlush) {
  Scope scope;
  Pair p;
  auto src = p.a->allocate(64, kAccessLocalWrite);
  auto dst = p.b->allocate(64, kAccessRemoteRead);  // no REMOTE_WRITE
  SendWr w;
  w.wr_id = 1;
  w.opcode = Opcode::kWrite;
  w.length = 8;  // unsignaled: an error completes anyway
  w.local_addr = src->data();
  w.lkey = src->lkey();
  w.remote_addr = dst->remote().addr;
  w.rkey = dst->rkey();
  ASSERT_TRUE(p.aqp->post_send(w).ok());
  EXPECT_EQ(wait_one(*p.acq).status, Status::kRemoteAccessError);
  w.wr_id = 2;
  ASSERT_TRUE(p.aqp->post_send(w).ok());
  EXPECT_EQ(wait_one(*p.acq).status, Status::kWrFlushError);
}

TEST(FakeProvider, HeldCompletionsArriveOnRelease) {
  Scope scope;
  Pair p;
  std::array<char, 4> buf{};
  set_filter(
      [](const Completion& c) { return c.ok() ? Verdict::kHold : Verdict::kDeliver; });
  auto dst = p.b->allocate(64, kAccessAll);
  SendWr w;
  w.opcode = Opcode::kWrite;
  w.flags = kSignaled | kInline;
  w.length = 4;
  w.local_addr = buf.data();
  w.remote_addr = dst->remote().addr;
  w.rkey = dst->rkey();
  ASSERT_TRUE(p.aqp->post_send(w).ok());
  Completion c;
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(p.acq->poll({&c, 1}), 0);
  EXPECT_EQ(held_count(), 1u);
  EXPECT_TRUE(p.acq->arm());
  EXPECT_EQ(release_held(), 1u);
  pollfd pfd{p.acq->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 1000), 1);  // the armed CQ's fd wakes
  EXPECT_EQ(p.acq->poll({&c, 1}), 1);
}

TEST(FakeProvider, ADeadPeerFailsEverythingWithinItsPeerTimeout) {
  Scope scope;
  Pair p(200ms, 150ms);
  std::array<char, 8> in{};
  auto mr = p.a->register_memory(in.data(), in.size(), kAccessLocalWrite);
  ASSERT_TRUE(p.aqp->post_recv(RecvWr{9, in.data(), 8, mr->lkey()}).ok());
  kill(p.bqp->qp_num());
  const auto t0 = std::chrono::steady_clock::now();
  const Completion c = wait_one(*p.acq);
  EXPECT_EQ(c.status, Status::kWrFlushError);
  EXPECT_EQ(c.wr_id, 9u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 140ms);
  EXPECT_EQ(p.aqp->state(), QpState::kError);
}

TEST(FakeProvider, KillAfterCountsExecutedRequests) {
  Scope scope;
  Pair p(200ms, 100ms);
  auto src = p.a->allocate(64, kAccessLocalWrite);
  auto dst = p.b->allocate(64, kAccessAll);
  kill_after(p.aqp->qp_num(), 2);
  SendWr w;
  w.opcode = Opcode::kWrite;
  w.flags = kSignaled;
  w.length = 1;
  w.local_addr = src->data();
  w.lkey = src->lkey();
  w.remote_addr = dst->remote().addr;
  w.rkey = dst->rkey();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(p.aqp->post_send(w).ok());
  EXPECT_EQ(executed(p.aqp->qp_num()), 2u);
  // The dead side completes nothing more: two completions, never a third.
  EXPECT_TRUE(wait_one(*p.acq).ok());
  EXPECT_TRUE(wait_one(*p.acq).ok());
  std::this_thread::sleep_for(300ms);
  Completion c;
  EXPECT_EQ(p.acq->poll({&c, 1}), 0);
  // Its peer fails once its peer_timeout passes.
  EXPECT_EQ(p.bqp->state(), QpState::kError);
}

}  // namespace
}  // namespace rdmakit::fake
