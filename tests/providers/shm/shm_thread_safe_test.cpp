// Thread-safe QPs on shm: several threads post while one thread owns (polls)
// the CQ. Every request completes exactly once and nothing races (this test
// runs under TSan in CI).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;

struct Link {
  std::unique_ptr<QueuePair> a, b;
};

Link connect(Context& ctx, CompletionQueue& a_cq, CompletionQueue& b_cq) {
  auto listener = ctx.listen("127.0.0.1:0");
  QpOptions b_opts{
      .send_cq = &b_cq, .recv_cq = &b_cq, .max_send_wr = 64, .max_recv_wr = 64};
  b_opts.thread_safe = true;
  auto accepted =
      std::async(std::launch::async, [&] { return listener->accept(b_opts, 10s); });
  QpOptions a_opts{
      .send_cq = &a_cq, .recv_cq = &a_cq, .max_send_wr = 64, .max_recv_wr = 64};
  a_opts.thread_safe = true;
  Link link;
  link.a = ctx.connect("127.0.0.1:" + std::to_string(listener->port()), a_opts);
  link.b = accepted.get();
  return link;
}

std::unique_ptr<Context> open_shm() {
  ContextOptions options;
  options.provider = ProviderKind::kShm;
  return Context::open(options);
}

// Calls post(i) for i in [0, count), retrying each while the queue is full.
void post_all(uint64_t count, const std::function<PostResult(uint64_t)>& post) {
  for (uint64_t i = 0; i < count;) {
    const PostResult r = post(i);
    if (r.ok()) {
      ++i;
    } else if (r.status == PostStatus::kQueueFull) {
      std::this_thread::yield();
    } else {
      ADD_FAILURE() << post_status_name(r.status);
      return;
    }
  }
}

TEST(ShmThreadSafeTest, TwoPostingThreadsOneCqOwner) {
  constexpr uint64_t kPerThread = 5000;
  auto ctx = open_shm();
  auto shared_cq = ctx->create_cq();
  auto cq1 = ctx->create_cq();
  auto cq2 = ctx->create_cq();
  auto mem = ctx->allocate(1 << 16, kAccessAll);
  Link l1 = connect(*ctx, *shared_cq, *cq1);
  Link l2 = connect(*ctx, *shared_cq, *cq2);
  auto writer = [&](QueuePair& qp, uint64_t tag, size_t offset) {
    post_all(kPerThread, [&](uint64_t i) {
      return qp.post_send(
          SendWr{.wr_id = (tag << 32) | i,
                 .opcode = Opcode::kWrite,
                 .flags = kSignaled,
                 .length = 8,
                 .local_addr = mem->data() + offset,
                 .lkey = mem->lkey(),
                 .remote_addr = reinterpret_cast<uint64_t>(mem->data() + 8192 + offset),
                 .rkey = mem->rkey()});
    });
  };
  std::thread t1(writer, std::ref(*l1.a), 1, 0);
  std::thread t2(writer, std::ref(*l2.a), 2, 64);
  std::vector<uint64_t> next(3, 0);  // per tag: completions arrive in order
  uint64_t got = 0;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  Completion c[16];
  while (got < 2 * kPerThread && std::chrono::steady_clock::now() < give_up) {
    const int n = shared_cq->poll(c);
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(c[k].status, Status::kSuccess) << status_name(c[k].status);
      const uint64_t tag = c[k].wr_id >> 32;
      ASSERT_TRUE(tag == 1 || tag == 2);
      ASSERT_EQ(c[k].wr_id & 0xffffffff, next[tag]) << "tag " << tag;
      ++next[tag];
    }
    got += static_cast<uint64_t>(n);
  }
  t1.join();
  t2.join();
  EXPECT_EQ(got, 2 * kPerThread);
  EXPECT_EQ(shared_cq->poll(c), 0);
}

TEST(ShmThreadSafeTest, RecvsPostedByOneThreadPolledByAnother) {
  constexpr uint64_t kMessages = 5000;
  auto ctx = open_shm();
  auto a_cq = ctx->create_cq();
  auto b_cq = ctx->create_cq();
  auto mem = ctx->allocate(1 << 16, kAccessAll);
  Link l = connect(*ctx, *a_cq, *b_cq);
  std::atomic<uint64_t> received{0};
  // Keeps b's receive queue stocked from a thread that never polls.
  std::thread poster([&] {
    post_all(kMessages, [&](uint64_t i) {
      return l.b->post_recv(RecvWr{
          .wr_id = i, .addr = mem->data() + 4096, .length = 64, .lkey = mem->lkey()});
    });
  });
  // The sender owns a's CQ: it polls it to reap (and to drive RNR retries).
  std::thread sender([&] {
    Completion c[16];
    uint64_t done = 0;
    for (uint64_t i = 0; i < kMessages;) {
      const PostResult r = l.a->post_send(SendWr{.wr_id = i,
                                                 .opcode = Opcode::kSend,
                                                 .flags = kSignaled | kInline,
                                                 .length = 8,
                                                 .local_addr = mem->data(),
                                                 .lkey = mem->lkey()});
      if (r.ok()) ++i;
      const int n = a_cq->poll(c);
      for (int k = 0; k < n; ++k) EXPECT_EQ(c[k].status, Status::kSuccess);
      done += static_cast<uint64_t>(n);
    }
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    while (done < kMessages && std::chrono::steady_clock::now() < give_up) {
      done += static_cast<uint64_t>(a_cq->poll(c));
    }
    EXPECT_EQ(done, kMessages);
  });
  Completion c[16];
  uint64_t next = 0;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (next < kMessages && std::chrono::steady_clock::now() < give_up) {
    const int n = b_cq->poll(c);
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(c[k].status, Status::kSuccess) << status_name(c[k].status);
      ASSERT_EQ(c[k].wr_id, next);
      ++next;
    }
  }
  received = next;
  poster.join();
  sender.join();
  EXPECT_EQ(received.load(), kMessages);
}

}  // namespace
}  // namespace rdmakit::shm
