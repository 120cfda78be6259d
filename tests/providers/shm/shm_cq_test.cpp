// shm completion queue: what a destroyed QP leaves behind, and wake-ups of a
// sleeping owner by producers on other threads.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#include "shm_in_process.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;

// Within one region: from its start to offset 64.
SendWr write_wr(uint64_t wr_id, MemoryRegion& mem) {
  return shm::write_wr(wr_id, mem, reinterpret_cast<uint64_t>(mem.data() + 64),
                       mem.rkey());
}

// A QP destroyed with unpolled completions gives its CQ capacity back, so its
// completions must leave the CQ with it (dropped, as a NIC cleans its CQ at
// ibv_destroy_qp): they were kept, the next QP's completions overran the
// ring, and poll returned those twice while the first QP's were lost.
TEST(ShmCqTest, DestroyedQpTakesItsCompletionsAlong) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq({.capacity = 16});
  auto other = ctx->create_cq();
  auto mem = ctx->allocate(4096, kAccessAll);
  const QpOptions on_cq{
      .send_cq = cq.get(), .recv_cq = other.get(), .max_send_wr = 16, .max_recv_wr = 4};
  const QpOptions peer{
      .send_cq = other.get(), .recv_cq = other.get(), .max_send_wr = 4, .max_recv_wr = 4};
  {
    Pair first = connect_pair(*ctx, *ctx, on_cq, peer);
    for (uint64_t i = 0; i < 16; ++i) {
      ASSERT_TRUE(first.a->post_send(write_wr(1000 + i, *mem)).ok());
    }
  }  // destroyed with 16 completions unpolled
  Pair second = connect_pair(*ctx, *ctx, on_cq, peer);
  for (uint64_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(second.a->post_send(write_wr(2000 + i, *mem)).ok());
  }
  Completion out[64];
  const int n = cq->poll(out);
  ASSERT_EQ(n, 16);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[i].wr_id, 2000u + i);
    EXPECT_EQ(out[i].status, Status::kSuccess);
  }
  EXPECT_EQ(cq->poll(out), 0);
}

// A thread-safe QP posting from another thread wakes an owner asleep in
// wait(): the completion's producer writes the CQ's eventfd when it is armed
// (wait() slept out its whole timeout).
TEST(ShmCqTest, ProducerOnAnotherThreadWakesTheSleepingOwner) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto other = ctx->create_cq();
  auto mem = ctx->allocate(4096, kAccessAll);
  QpOptions posting{
      .send_cq = cq.get(), .recv_cq = cq.get(), .max_send_wr = 16, .max_recv_wr = 4};
  posting.thread_safe = true;
  Pair p = connect_pair(*ctx, *ctx, posting,
                        {.send_cq = other.get(),
                         .recv_cq = other.get(),
                         .max_send_wr = 4,
                         .max_recv_wr = 4});
  for (int round = 0; round < 3; ++round) {
    std::thread poster([&] {
      std::this_thread::sleep_for(100ms);
      EXPECT_TRUE(p.a->post_send(write_wr(7 + round, *mem)).ok());
    });
    Completion out[4];
    const auto t0 = std::chrono::steady_clock::now();
    const int n = cq->wait(out, 5s);
    const auto waited = std::chrono::steady_clock::now() - t0;
    poster.join();
    ASSERT_EQ(n, 1);
    EXPECT_EQ(out[0].wr_id, 7u + round);
    EXPECT_LT(waited, 2s) << "the owner slept through the completion";
  }
}

int shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("rdmakit-shm") != std::string::npos;
  }
  return n;
}

// A QP refused after the handshake (here: its depths exceed the CQ's
// capacity) unmaps the peer's table and ring and its own ring (each refusal
// left three mappings behind, about 130 KiB).
TEST(ShmCqTest, RefusedQpLeavesNothingMapped) {
  auto ctx = open_shm();
  auto small = ctx->create_cq({.capacity = 8});
  auto other = ctx->create_cq();
  const QpOptions too_deep{.send_cq = small.get(),
                           .recv_cq = small.get(),
                           .max_send_wr = 64,
                           .max_recv_wr = 64};
  const QpOptions peer{
      .send_cq = other.get(), .recv_cq = other.get(), .max_send_wr = 4, .max_recv_wr = 4};
  auto listener = ctx->listen("127.0.0.1:0");
  const std::string address = "127.0.0.1:" + std::to_string(listener->port());
  std::vector<std::unique_ptr<QueuePair>> accepted;
  const int before = shm_mappings();
  for (int i = 0; i < 10; ++i) {
    auto peer_side =
        std::async(std::launch::async, [&] { return listener->accept(peer, 10s); });
    EXPECT_THROW(ctx->connect(address, too_deep), Error);
    accepted.push_back(peer_side.get());
  }
  accepted.clear();
  EXPECT_EQ(shm_mappings(), before);
}

// SRQ entries that senders consumed for a QP destroyed before its receive
// completions were polled go back to the SRQ (they held its capacity for
// good: the next round's RECVs were refused).
TEST(ShmCqTest, DestroyedSrqQpGivesBackItsEntries) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto mem = ctx->allocate(1 << 16, kAccessAll);
  auto srq = ctx->create_srq({.max_wr = 4});
  for (int round = 0; round < 3; ++round) {
    QpOptions server{.send_cq = cq.get(), .recv_cq = cq.get()};
    server.srq = srq.get();
    Pair p = connect_pair(*ctx, *ctx, {.send_cq = cq.get(), .recv_cq = cq.get()}, server);
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(srq->post_recv(RecvWr{.wr_id = uint64_t(i),
                                        .addr = mem->data() + 1024 * i,
                                        .length = 1024,
                                        .lkey = mem->lkey()})
                      .ok())
          << "round " << round << ", RECV " << i;
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(p.a->post_send(SendWr{.wr_id = 100u + i,
                                        .opcode = Opcode::kSend,
                                        .length = 64,
                                        .local_addr = mem->data() + 8192,
                                        .lkey = mem->lkey()})
                      .ok());
    }
    p.b.reset();  // all four RECVs consumed, none polled
    Completion out[16];
    while (cq->poll(out) > 0) {
    }
  }
}

// The receiver's QP enters the error state while a sender is writing a large
// SEND into the buffer of a RECV it already took. Sender and receiver must
// agree: both succeed, or the RECV is flushed and its buffer is not written
// after the flush was reported (it was flushed while the copy went on, and
// the sender reported success).
TEST(ShmErrorTest, RecvBeingFilledIsNotFlushedUnderTheSender) {
  constexpr uint32_t kLen = 32u << 20;
  auto ctx = open_shm();
  auto send_cq = ctx->create_cq();
  auto recv_cq = ctx->create_cq();
  auto send_mem = ctx->allocate(kLen, kAccessAll);
  auto recv_mem = ctx->allocate(kLen, kAccessAll);
  Pair p = connect_pair(*ctx, *ctx, {.send_cq = send_cq.get(), .recv_cq = send_cq.get()},
                        {.send_cq = recv_cq.get(), .recv_cq = recv_cq.get()});
  std::memset(recv_mem->data(), 0, kLen);
  std::memset(send_mem->data(), 0xab, kLen);
  ASSERT_TRUE(p.b->post_recv(RecvWr{.wr_id = 42,
                                    .addr = recv_mem->data(),
                                    .length = kLen,
                                    .lkey = recv_mem->lkey()})
                  .ok());
  std::atomic<bool> go{false};
  Status sent = Status::kSuccess;
  std::thread sender([&] {
    while (!go.load()) {
    }
    EXPECT_TRUE(p.a->post_send(SendWr{.wr_id = 1,
                                      .opcode = Opcode::kSend,
                                      .flags = kSignaled,
                                      .length = kLen,
                                      .local_addr = send_mem->data(),
                                      .lkey = send_mem->lkey()})
                    .ok());
    Completion c[4];
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    int n = 0;
    while (n == 0 && std::chrono::steady_clock::now() < give_up) n = send_cq->poll(c);
    ASSERT_EQ(n, 1);
    sent = c[0].status;
  });
  go.store(true);
  std::this_thread::sleep_for(1ms);  // the sender is inside its copy
  // The receiver's own WRITE with a bad rkey puts its QP in error.
  ASSERT_TRUE(p.b->post_send(SendWr{.wr_id = 9,
                                    .opcode = Opcode::kWrite,
                                    .flags = kSignaled,
                                    .length = 8,
                                    .local_addr = recv_mem->data(),
                                    .lkey = recv_mem->lkey(),
                                    .remote_addr = 64,
                                    .rkey = 0x7777})
                  .ok());
  Status received = Status::kSuccess;
  uint8_t last_byte_then = 0;
  bool got = false;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  Completion c[8];
  while (!got && std::chrono::steady_clock::now() < give_up) {
    const int n = recv_cq->poll(c);
    for (int i = 0; i < n; ++i) {
      if (c[i].wr_id != 42) continue;
      got = true;
      received = c[i].status;
      last_byte_then = static_cast<uint8_t>(recv_mem->data()[kLen - 1]);
    }
  }
  sender.join();
  ASSERT_TRUE(got);
  if (received == Status::kSuccess) {
    EXPECT_EQ(sent, Status::kSuccess);
    EXPECT_EQ(last_byte_then, 0xab);
  } else {
    EXPECT_EQ(received, Status::kWrFlushError) << status_name(received);
    EXPECT_NE(sent, Status::kSuccess) << "the sender succeeded into a flushed RECV";
    EXPECT_EQ(static_cast<uint8_t>(recv_mem->data()[kLen - 1]), last_byte_then)
        << "the buffer was written after its RECV was flushed";
  }
}

// A SEND waiting for a RECV (RNR) when the peer dies completes with
// RETRY_EXCEEDED, and then nothing is left to retry: an armed CQ sleeps
// (arm() kept a 1 ms retry timer running for good).
TEST(ShmErrorTest, PeerDeathDuringRnrLeavesNoRetryTimer) {
  auto ctx = open_shm();
  auto cq = ctx->create_cq();
  auto other = ctx->create_cq();
  auto mem = ctx->allocate(4096, kAccessAll);
  Pair p = connect_pair(*ctx, *ctx, {.send_cq = cq.get(), .recv_cq = cq.get()},
                        {.send_cq = other.get(), .recv_cq = other.get()});
  ASSERT_TRUE(p.a->post_send(SendWr{.wr_id = 5,
                                    .opcode = Opcode::kSend,
                                    .flags = kSignaled | kInline,
                                    .length = 8,
                                    .local_addr = mem->data(),
                                    .lkey = mem->lkey()})
                  .ok());
  Completion c[8];
  EXPECT_EQ(cq->poll(c), 0);  // waiting for a RECV
  p.b.reset();                // the peer goes away
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  int n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < give_up) n = cq->poll(c);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(c[0].wr_id, 5u);
  EXPECT_EQ(c[0].status, Status::kRetryExceeded) << status_name(c[0].status);
  // The progress thread may still report the hang-up once (a wake-up); a
  // retry timer would wake the CQ every time it is armed.
  int quiet = 0;
  for (int attempt = 0; attempt < 3 && quiet == 0; ++attempt) {
    while (cq->poll(c) > 0) {
    }
    if (!cq->arm()) continue;
    pollfd pfd{cq->fd(), POLLIN, 0};
    if (::poll(&pfd, 1, 50) == 0) quiet = 1;
  }
  EXPECT_EQ(quiet, 1) << "the armed CQ keeps waking with nothing to do";
}

}  // namespace
}  // namespace rdmakit::shm
