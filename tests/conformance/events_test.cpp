// Completion event modes (blocking wait, epoll on fd() with arm()) and one
// CQ shared by many QPs.
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;

class EventTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(EventTest);

std::chrono::nanoseconds thread_cpu_time() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

constexpr uint32_t kMsgLen = 200;
constexpr int kEpollMessages = 5;

// Server side of the event tests: on each "sendN:<delay ms>" request, sleeps
// that long and SENDs one message with pattern seed 300 + its index.
void message_server(RoleEnv& env) {
  auto ctx = env.open_context();
  auto listener = env.listen(*ctx);
  Endpoint ep = accept_endpoint(*ctx, *listener);
  auto ctl = Control::accept(*ctx, *listener);
  Buffer local = make_buffer(*ctx, MemKind::kAllocated, 64 * kMsgLen, kAccessLocalWrite);
  uint64_t index = 0;
  for (;;) {
    std::string request;
    ASSERT_TRUE(ctl->recv(&request));
    if (request == "bye") return;
    const auto colon = request.find(':');
    ASSERT_NE(colon, std::string::npos) << request;
    const int count = std::stoi(request.substr(0, colon));
    const int delay_ms = std::stoi(request.substr(colon + 1));
    for (int i = 0; i < count; ++i, ++index) {
      std::this_thread::sleep_for(milliseconds(delay_ms));
      ASSERT_LT(index, 64u);
      fill_pattern(local.data() + index * kMsgLen, kMsgLen, 300 + index);
      ASSERT_TRUE(post(*ep.qp, send_wr(index, *local.mr, index * kMsgLen, kMsgLen)));
      Completion c;
      ASSERT_TRUE(wait_one(*ep.send_cq, &c));
      ASSERT_EQ(c.status, Status::kSuccess);
    }
  }
}

void check_message(const Completion& c, const Buffer& recv, uint64_t index) {
  EXPECT_EQ(c.status, Status::kSuccess);
  EXPECT_EQ(c.wr_id, index);
  EXPECT_EQ(c.byte_len, kMsgLen);
  EXPECT_TRUE(check_pattern(recv.data() + index * kMsgLen, kMsgLen, 300 + index));
}

TEST_P(EventTest, BlockingWaitSleepsUntilALateCompletion) {
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    CqOptions cq_options;
    cq_options.spin = std::chrono::microseconds(500);
    Endpoint ep = connect_endpoint(env, *ctx, test_qp_options(), {}, cq_options);
    auto ctl = Control::connect(env, *ctx);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 64 * kMsgLen, kAccessLocalWrite);
    ASSERT_TRUE(post(*ep.qp, recv_wr(0, *recv.mr, 0, kMsgLen)));
    // The message comes 300 ms later: far beyond the 0.5 ms spin budget.
    ASSERT_TRUE(ctl->send("1:300"));
    std::array<Completion, 4> out;
    const auto start = Clock::now();
    const auto cpu_start = thread_cpu_time();
    const int n = ep.recv_cq->wait(out, std::chrono::seconds(5));
    const auto wall = Clock::now() - start;
    const auto cpu = thread_cpu_time() - cpu_start;
    ASSERT_EQ(n, 1) << "wait() missed the completion";
    check_message(out[0], recv, 0);
    EXPECT_GE(wall, milliseconds(200));
    EXPECT_LT(wall, milliseconds(3000)) << "woke up late";
    EXPECT_LT(cpu, wall / 2) << "wait() kept spinning instead of sleeping";
    // A timeout with nothing pending returns 0, roughly on time.
    const auto t0 = Clock::now();
    EXPECT_EQ(ep.recv_cq->wait(out, milliseconds(100)), 0);
    const auto waited = Clock::now() - t0;
    EXPECT_GE(waited, milliseconds(90));
    EXPECT_LT(waited, milliseconds(1000));
    ASSERT_TRUE(ctl->send("bye"));
  };
  run(message_server, client);
}

TEST_P(EventTest, EpollOnCqFdFollowsTheArmRule) {
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx);
    auto ctl = Control::connect(env, *ctx);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 64 * kMsgLen, kAccessLocalWrite);
    for (uint64_t i = 0; i <= kEpollMessages; ++i) {
      ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * kMsgLen, kMsgLen)));
    }
    CompletionQueue& cq = *ep.recv_cq;
    const int epfd = ::epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(epfd, 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ASSERT_EQ(::epoll_ctl(epfd, EPOLL_CTL_ADD, cq.fd(), &ev), 0) << std::strerror(errno);

    // Messages arrive 100 ms apart while this thread sleeps in epoll_wait.
    ASSERT_TRUE(ctl->send(std::to_string(kEpollMessages) + ":100"));
    std::vector<Completion> got;
    int wakeups = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (got.size() < kEpollMessages && Clock::now() < deadline) {
      if (cq.arm()) {
        epoll_event fired{};
        const int r = ::epoll_wait(epfd, &fired, 1, 2000);
        ASSERT_GE(r, 0) << std::strerror(errno);
        if (r > 0) ++wakeups;
      }
      std::array<Completion, 8> out;
      const int n = cq.poll(out);
      got.insert(got.end(), out.begin(), out.begin() + n);
    }
    ASSERT_EQ(got.size(), size_t{kEpollMessages}) << "completions were missed";
    for (size_t i = 0; i < got.size(); ++i) check_message(got[i], recv, i);
    EXPECT_GE(wakeups, 1) << "the fd never woke the sleeping thread";

    // A completion that is already pending: arm() says so instead of
    // letting the caller sleep.
    ASSERT_TRUE(ctl->send("1:0"));
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_FALSE(cq.arm()) << "arm() with a pending completion must return false";
    Completion c;
    ASSERT_TRUE(wait_one(cq, &c));
    check_message(c, recv, kEpollMessages);
    ::close(epfd);
    ASSERT_TRUE(ctl->send("bye"));
  };
  run(message_server, client);
}

// ----------------------------------------------------------- shared CQ

constexpr int kSharedQps = 64;

struct SharedSide {
  std::unique_ptr<CompletionQueue> cq;
  std::vector<std::unique_ptr<QueuePair>> qps;
  Buffer buf;
};

QpOptions shared_options(CompletionQueue* cq) {
  QpOptions options = test_qp_options();
  options.send_cq = cq;
  options.recv_cq = cq;
  options.max_send_wr = 4;
  options.max_recv_wr = 4;
  return options;
}

// Sends message i on QP i and receives one message on every QP: all
// completions come through the one CQ, tagged with the right qp_num.
void exchange_on_shared_cq(SharedSide& side, uint64_t send_seed, uint64_t recv_seed) {
  std::vector<uint32_t> nums;
  for (const auto& qp : side.qps) nums.push_back(qp->qp_num());
  EXPECT_EQ(std::set<uint32_t>(nums.begin(), nums.end()).size(), nums.size())
      << "qp_num values are not distinct";
  for (int i = 0; i < kSharedQps; ++i) {
    std::byte* msg = side.buf.data() + (kSharedQps + i) * kMsgLen;
    fill_pattern(msg, kMsgLen, send_seed + i);
    ASSERT_TRUE(post(*side.qps[i], send_wr(1000 + i, *side.buf.mr,
                                           (kSharedQps + i) * kMsgLen, kMsgLen)));
  }
  std::vector<Completion> got;
  ASSERT_TRUE(wait_n(*side.cq, 2 * kSharedQps, &got));
  std::set<uint32_t> recv_qps, send_qps;
  for (const Completion& c : got) {
    ASSERT_EQ(c.status, Status::kSuccess);
    const auto it = std::find(nums.begin(), nums.end(), c.qp_num);
    ASSERT_NE(it, nums.end()) << "completion for unknown qp_num " << c.qp_num;
    const auto index = static_cast<uint64_t>(it - nums.begin());
    if (c.opcode == Opcode::kRecv) {
      EXPECT_TRUE(recv_qps.insert(c.qp_num).second) << "two RECVs on one QP";
      EXPECT_EQ(c.wr_id, index) << "RECV completion on the wrong QP";
      EXPECT_TRUE(
          check_pattern(side.buf.data() + index * kMsgLen, kMsgLen, recv_seed + index))
          << "message of QP " << index;
    } else {
      EXPECT_EQ(c.opcode, Opcode::kSend);
      EXPECT_TRUE(send_qps.insert(c.qp_num).second) << "two SENDs on one QP";
      EXPECT_EQ(c.wr_id, 1000 + index) << "SEND completion on the wrong QP";
    }
  }
  EXPECT_EQ(recv_qps.size(), size_t{kSharedQps});
  EXPECT_EQ(send_qps.size(), size_t{kSharedQps});
}

TEST_P(EventTest, OneCqSharedBySixtyFourQps) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    SharedSide side;
    side.cq = ctx->create_cq();
    side.buf = make_buffer(*ctx, MemKind::kAllocated, 2 * kSharedQps * kMsgLen,
                           kAccessLocalWrite);
    for (int i = 0; i < kSharedQps; ++i) {
      side.qps.push_back(
          listener->accept(shared_options(side.cq.get()), control_timeout()));
      ASSERT_TRUE(post(*side.qps.back(), recv_wr(i, *side.buf.mr, i * kMsgLen, kMsgLen)));
    }
    exchange_on_shared_cq(side, 7000, 6000);
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    SharedSide side;
    side.cq = ctx->create_cq();
    side.buf = make_buffer(*ctx, MemKind::kAllocated, 2 * kSharedQps * kMsgLen,
                           kAccessLocalWrite);
    for (int i = 0; i < kSharedQps; ++i) {
      side.qps.push_back(env.connect(*ctx, shared_options(side.cq.get())));
      ASSERT_TRUE(post(*side.qps.back(), recv_wr(i, *side.buf.mr, i * kMsgLen, kMsgLen)));
    }
    exchange_on_shared_cq(side, 6000, 7000);
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
