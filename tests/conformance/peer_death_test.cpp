// A peer SIGKILLed mid-transfer: the survivor's outstanding requests all
// complete with an error within peer_timeout (+ slack), and its QP ends in
// the error state. Nothing hangs.
#include <signal.h>

#include <algorithm>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;

class PeerDeathTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(PeerDeathTest);

constexpr milliseconds kPeerTimeout{1000};
constexpr milliseconds kSlack{2000};
constexpr uint32_t kVictimRecvs = 64;
constexpr uint64_t kSendsBeforeDeath = 200;
constexpr size_t kWindow = 64 * 1024;  // victim region the survivor writes
constexpr uint32_t kWriteLen = 16 * 1024;
constexpr uint32_t kSendLen = 1024;
constexpr uint32_t kSurvivorRecvs = 8;

QpOptions death_qp_options() {
  QpOptions options = test_qp_options();
  options.peer_timeout = kPeerTimeout;
  return options;
}

// The victim consumes SENDs, then announces its death and SIGKILLs itself.
void victim(Endpoint& ep, Control& ctl, Context& ctx) {
  Buffer recv =
      make_buffer(ctx, MemKind::kAllocated, kVictimRecvs * kSendLen, kAccessLocalWrite);
  for (uint32_t i = 0; i < kVictimRecvs; ++i) {
    ASSERT_TRUE(post(*ep.qp, recv_wr(i, *recv.mr, i * kSendLen, kSendLen)));
  }
  ASSERT_TRUE(ctl.send("go"));
  for (uint64_t got = 0; got < kSendsBeforeDeath; ++got) {
    Completion c;
    ASSERT_TRUE(wait_one(*ep.recv_cq, &c));
    ASSERT_EQ(c.status, Status::kSuccess);
    ASSERT_TRUE(post(*ep.qp, recv_wr(c.wr_id, *recv.mr, c.wr_id * kSendLen, kSendLen)));
  }
  ASSERT_TRUE(ctl.send("dying"));
  std::fflush(nullptr);
  ::raise(SIGKILL);
}

// The survivor streams WRITEs and SENDs until the peer's death shows, then
// drains: every outstanding request must fail, and in bounded time.
void survivor(Endpoint& ep, Control& ctl, Context& ctx, const RemoteRegion& rr) {
  Buffer local = make_buffer(ctx, MemKind::kAllocated, kWindow + 4096, kAccessLocalWrite);
  fill_pattern(local.data(), kWindow, 5);
  for (uint32_t i = 0; i < kSurvivorRecvs; ++i) {
    ASSERT_TRUE(post(*ep.qp, recv_wr(900000 + i, *local.mr, kWindow, 512)));
  }
  ASSERT_TRUE(ctl.expect("go"));
  const uint32_t depth = std::min<uint32_t>(ep.qp->options().max_send_wr, 32);
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  Clock::time_point death_seen{};  // "dying" received, or the control QP failed
  uint64_t next = 0;
  uint64_t outstanding = 0;
  uint64_t ok = 0;
  bool failing = false;
  std::vector<Completion> batch(64);
  std::string msg;
  while (!failing) {
    ASSERT_LT(Clock::now(), give_up) << "the peer's death was never noticed";
    if (death_seen == Clock::time_point{} && (ctl.try_recv(&msg) || ctl.failed())) {
      death_seen = Clock::now();
    }
    while (outstanding < depth) {
      const SendWr wr = next % 4 == 3 ? send_wr(next, *local.mr, 0, kSendLen)
                                      : rdma_wr(Opcode::kWrite, next, *local.mr, 0,
                                                kWriteLen, rr, (next % 4) * kWriteLen);
      const PostResult r = ep.qp->post_send(wr);
      ASSERT_TRUE(r.ok()) << post_status_name(r.status);
      ++next;
      ++outstanding;
    }
    const int n = ep.send_cq->wait(batch, milliseconds(50));
    for (int i = 0; i < n; ++i) {
      --outstanding;
      if (batch[static_cast<size_t>(i)].ok()) {
        ++ok;
      } else {
        failing = true;
      }
    }
  }
  if (death_seen == Clock::time_point{}) death_seen = Clock::now();
  EXPECT_GE(ok, kSendsBeforeDeath) << "the stream was not running";

  // Every remaining send and every posted RECV completes, none successfully.
  const auto deadline = death_seen + kPeerTimeout + kSlack;
  std::vector<Completion> rest;
  EXPECT_TRUE(wait_n(*ep.send_cq, outstanding, &rest,
                     std::chrono::duration_cast<milliseconds>(
                         std::max(deadline - Clock::now(), Clock::duration::zero()))))
      << "outstanding sends did not complete within peer_timeout + slack";
  for (const Completion& c : rest) {
    EXPECT_FALSE(c.ok()) << "a request after the first failure succeeded";
  }
  std::vector<Completion> recvs;
  EXPECT_TRUE(wait_n(*ep.recv_cq, kSurvivorRecvs, &recvs, milliseconds(kSlack)))
      << "posted RECVs were not flushed";
  for (const Completion& c : recvs) EXPECT_FALSE(c.ok());
  EXPECT_EQ(ep.qp->state(), QpState::kError);
  // Nothing more trickles in later.
  EXPECT_TRUE(expect_quiet(*ep.send_cq, milliseconds(50)));
}

TEST_P(PeerDeathTest, ServerKilledMidTransfer) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer window = make_buffer(*ctx, MemKind::kAllocated, kWindow, kAccessAll);
    const auto reply = pack_regions({window.mr->remote()});
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, death_qp_options(), reply);
    auto ctl = Control::accept(*ctx, *listener);
    victim(ep, *ctl, *ctx);
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Endpoint ep = connect_endpoint(env, *ctx, death_qp_options());
    auto ctl = Control::connect(env, *ctx);
    survivor(ep, *ctl, *ctx, unpack_regions(ep.qp->peer_private_data()).at(0));
  };
  RunOptions options;
  options.server_may_be_killed = true;
  run(server, client, options);
}

TEST_P(PeerDeathTest, ClientKilledMidTransfer) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    Endpoint ep = accept_endpoint(*ctx, *listener, death_qp_options());
    auto ctl = Control::accept(*ctx, *listener);
    survivor(ep, *ctl, *ctx, unpack_regions(ep.qp->peer_private_data()).at(0));
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    Buffer window = make_buffer(*ctx, MemKind::kAllocated, kWindow, kAccessAll);
    const auto blob = pack_regions({window.mr->remote()});
    Endpoint ep = connect_endpoint(env, *ctx, death_qp_options(), blob);
    auto ctl = Control::connect(env, *ctx);
    victim(ep, *ctl, *ctx);
  };
  RunOptions options;
  options.client_may_be_killed = true;
  run(server, client, options);
}

}  // namespace
}  // namespace rdmakit::test
