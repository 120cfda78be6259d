// Session protocol cases at exact moments, staged with the fake provider.
// Each names the mechanism it checks; without it the case fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_provider.hpp"
#include "rdmakit/session/session.hpp"

namespace rdmakit::fake {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

session::SessionOptions quick() {
  session::SessionOptions o;
  o.recv_depth = 16;
  o.max_message = 2048;
  o.heartbeat = 50ms;
  o.liveness = 400ms;
  o.peer_timeout = 5000ms;
  o.op_timeout = 10000ms;
  o.connect_timeout = 3000ms;
  return o;
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (!done() && Clock::now() < until) std::this_thread::sleep_for(2ms);
  return done();
}

// Mechanism: message credits. The server's receive completions are held
// back for longer than the transport's RNR retries last (3 s), so it
// re-posts nothing; the client sends three times its credits meanwhile.
// The client must wait for credits instead of sending into RECVs that are
// not there: every message arrives, in order, and the endpoint stays up.
// Without the credit wait, the 17th SEND ends in RNR_RETRY_EXCEEDED.
TEST(FakeSession, CreditsKeepABurstFromEndingInRnr) {
  Scope scope;
  std::mutex mu;
  std::vector<std::string> got;
  std::atomic<int> disconnects{0};
  session::Handlers sh;
  sh.on_message = [&](session::Channel&, session::Message& m) {
    std::lock_guard lock(mu);
    got.emplace_back(m.text());
  };
  sh.on_disconnect = [&](session::Endpoint&, const session::DisconnectInfo&) {
    ++disconnects;
  };
  session::Server server("127.0.0.1:0", quick(), sh);
  server.start();
  session::Client client(quick());
  session::Endpoint& ep = client.connect(server.address());
  const auto server_qps = live_qps(Side::kAccepting);
  set_filter([server_qps](const Completion& c) {
    const bool ours =
        std::find(server_qps.begin(), server_qps.end(), c.qp_num) != server_qps.end();
    return ours && c.opcode == Opcode::kRecv ? Verdict::kHold : Verdict::kDeliver;
  });
  std::atomic<int> sent{0};
  std::thread sender([&] {
    for (int i = 0; i < 48; ++i) {
      const auto r = ep.channel().send("message " + std::to_string(i));
      EXPECT_TRUE(r.ok()) << i << ": " << r.detail;
      if (!r.ok()) return;
      ++sent;
    }
  });
  std::this_thread::sleep_for(3300ms);
  EXPECT_LE(sent.load(), 16) << "sent past the credits the server gave";
  set_filter(nullptr);
  release_held();
  sender.join();
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lock(mu);
        return got.size() == 48;
      },
      5000ms));
  for (int i = 0; i < 48; ++i)
    EXPECT_EQ(got[static_cast<size_t>(i)], "message " + std::to_string(i));
  EXPECT_TRUE(ep.connected());
  EXPECT_EQ(disconnects.load(), 0);
}

// Mechanism: heartbeats and the liveness bound. The client's process
// stops (its QPs send nothing and see nothing, and the transport keeps
// them up): the server must disconnect it as kPeerSilent within about
// liveness, with a detail naming the peer, not wait for the transport.
TEST(FakeSession, AStoppedPeerIsDisconnectedAsSilent) {
  Scope scope;
  std::mutex mu;
  std::vector<session::DisconnectInfo> gone;
  session::Handlers sh;
  sh.on_message = [](session::Channel&, session::Message&) {};
  sh.on_disconnect = [&](session::Endpoint&, const session::DisconnectInfo& i) {
    std::lock_guard lock(mu);
    gone.push_back(i);
  };
  session::Server server("127.0.0.1:0", quick(), sh);
  server.start();
  session::Client client(quick());
  session::Endpoint& ep = client.connect(server.address());
  ASSERT_TRUE(ep.channel().send("hello").ok());
  const auto t0 = Clock::now();
  for (uint32_t qp : live_qps(Side::kConnecting)) freeze(qp);
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lock(mu);
        return !gone.empty();
      },
      3000ms));
  const auto took = Clock::now() - t0;
  EXPECT_EQ(gone[0].reason, session::DisconnectReason::kPeerSilent)
      << session::disconnect_reason_name(gone[0].reason) << ": " << gone[0].detail;
  EXPECT_GE(took, 350ms);
  EXPECT_LT(took, 2000ms);
  for (uint32_t qp : live_qps(Side::kConnecting)) thaw(qp);
}

}  // namespace
}  // namespace rdmakit::fake
