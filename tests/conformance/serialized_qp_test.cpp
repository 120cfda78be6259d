// QpOptions::caller_serializes: any thread may post and poll, one at a time
// under the caller's own lock, and the QP keeps no owner thread.
#include <poll.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

class SerializedQpTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SerializedQpTest);

constexpr uint32_t kThreads = 2;
constexpr uint32_t kWritesPerThread = 200;
constexpr uint32_t kChunk = 16;
constexpr size_t kBytes = size_t{kThreads} * kWritesPerThread * kChunk;
constexpr uint64_t kSeed = 77;

// The server: a target of `bytes` for the client's WRITEs; once the client
// says "done", the first `checked` bytes must hold its pattern.
void serve_target(RoleEnv& env, size_t bytes, size_t checked) {
  auto ctx = env.open_context();
  Buffer target = make_buffer(*ctx, MemKind::kAllocated, bytes, kAccessAll);
  std::memset(target.data(), 0, bytes);
  const auto reply = pack_regions({target.mr->remote()});
  auto listener = env.listen(*ctx);
  Endpoint ep = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
  auto ctl = Control::accept(*ctx, *listener);
  ASSERT_TRUE(ctl->expect("done"));
  EXPECT_TRUE(check_pattern(target.data(), checked, kSeed));
}

// The client: a caller-serialized QP to the server's target and a local
// source of `bytes` filled with the pattern.
struct Client {
  std::unique_ptr<Context> ctx;
  Endpoint ep;
  std::unique_ptr<Control> ctl;
  RemoteRegion target;
  Buffer local;
};
Client connect_client(RoleEnv& env, size_t bytes, uint32_t max_send_wr) {
  Client c;
  c.ctx = env.open_context();
  QpOptions options = test_qp_options();
  options.caller_serializes = true;
  options.max_send_wr = max_send_wr;
  c.ep = connect_endpoint(env, *c.ctx, options);
  c.ctl = Control::connect(env, *c.ctx);
  c.target = unpack_regions(c.ep.qp->peer_private_data()).at(0);
  c.local = make_buffer(*c.ctx, MemKind::kAllocated, bytes, kAccessLocalWrite);
  fill_pattern(c.local.data(), bytes, kSeed);
  return c;
}

// Two threads take turns under one mutex: each posts WRITEs of its own
// chunks and reaps whatever completions are there, so posts and polls come
// from both threads, never at once. Every post is accepted, every WRITE
// completes, and the target holds every chunk (TSan sees no race: the
// caller's lock orders everything the QP does).
TEST_P(SerializedQpTest, PostsFromAnyThreadUnderTheCallersLock) {
  auto server = [](RoleEnv& env) { serve_target(env, kBytes, kBytes); };
  auto client = [](RoleEnv& env) {
    Client cl = connect_client(env, kBytes, 64);
    Endpoint& ep = cl.ep;
    const uint32_t max_send_wr = ep.qp->options().max_send_wr;
    std::mutex caller_lock;
    uint32_t completed = 0;
    uint32_t failed = 0;
    uint32_t refused = 0;
    uint32_t outstanding = 0;
    auto worker = [&](uint32_t t) {
      uint32_t posted = 0;
      Completion c[16];
      const auto give_up = std::chrono::steady_clock::now() + wait_timeout();
      while (std::chrono::steady_clock::now() < give_up) {
        const std::lock_guard lock(caller_lock);
        if (posted < kWritesPerThread && outstanding < max_send_wr) {
          const size_t off = (size_t{t} * kWritesPerThread + posted) * kChunk;
          const PostResult r = ep.qp->post_send(
              rdma_wr(Opcode::kWrite, off, *cl.local.mr, off, kChunk, cl.target, off));
          if (r.status == PostStatus::kOk) {
            ++posted;
            ++outstanding;
          } else {
            ++refused;
            return;
          }
        }
        const int n = ep.send_cq->poll(c);
        for (int i = 0; i < n; ++i) {
          ++completed;
          --outstanding;
          if (!c[i].ok()) ++failed;
        }
        if (posted == kWritesPerThread && completed == kThreads * kWritesPerThread)
          return;
        if (posted == kWritesPerThread && outstanding == 0) return;
      }
    };
    std::thread other(worker, 1);
    worker(0);
    other.join();
    // A thread that finished early left the other's completions to it; reap
    // what is left (from this thread, the lock no longer contended).
    std::vector<Completion> rest;
    if (completed < kThreads * kWritesPerThread) {
      EXPECT_TRUE(wait_n(*ep.send_cq, kThreads * kWritesPerThread - completed, &rest));
    }
    for (const Completion& c : rest) failed += c.ok() ? 0 : 1;
    EXPECT_EQ(refused, 0u) << "a post from the second thread was refused";
    EXPECT_EQ(completed + rest.size(), size_t{kThreads} * kWritesPerThread);
    EXPECT_EQ(failed, 0u);
    EXPECT_EQ(ep.qp->state(), QpState::kConnected);
    ASSERT_TRUE(cl.ctl->send("done"));
  };
  run(server, client);
}

// The thread that sleeps on an armed CQ is not the one that posts: a
// completion the post produces wakes it, as a NIC's would (a provider that
// completes at post time must signal the CQ's fd itself).
TEST_P(SerializedQpTest, APostWakesAnotherThreadSleepingOnTheArmedCq) {
  auto server = [](RoleEnv& env) { serve_target(env, 4096, 64); };
  auto client = [](RoleEnv& env) {
    Client cl = connect_client(env, 64, 16);
    Endpoint& ep = cl.ep;
    std::mutex caller_lock;
    std::atomic<bool> sleeping{false};
    bool woke = false;
    int reaped = 0;
    Completion c[4];
    std::thread sleeper([&] {
      {
        const std::lock_guard lock(caller_lock);
        // Nothing is pending yet, so arm() succeeds (else poll, as its rule says).
        if (!ep.send_cq->arm()) return;
      }
      sleeping = true;
      pollfd p{ep.send_cq->fd(), POLLIN, 0};
      woke = ::poll(&p, 1, 5000) == 1;
      const std::lock_guard lock(caller_lock);
      reaped = ep.send_cq->poll(c);
    });
    const auto give_up = std::chrono::steady_clock::now() + wait_timeout();
    while (!sleeping && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(1));
    std::this_thread::sleep_for(milliseconds(20));  // into its poll()
    {
      const std::lock_guard lock(caller_lock);
      EXPECT_TRUE(
          post(*ep.qp, rdma_wr(Opcode::kWrite, 5, *cl.local.mr, 0, 64, cl.target, 0)));
    }
    sleeper.join();
    EXPECT_TRUE(sleeping.load()) << "arm() found a completion pending";
    EXPECT_TRUE(woke) << "the sleeping thread was not woken by the completion";
    ASSERT_EQ(reaped, 1);
    EXPECT_EQ(c[0].wr_id, 5u);
    EXPECT_EQ(c[0].status, Status::kSuccess);
    ASSERT_TRUE(cl.ctl->send("done"));
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
