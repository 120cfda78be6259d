// Connecting to a port nobody listens on fails fast with a useful Error.
#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "conformance.hpp"

namespace rdmakit::test {
namespace {

using Clock = std::chrono::steady_clock;

class ConnectTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(ConnectTest);

TEST_P(ConnectTest, RefusedConnectThrowsNamingProviderAndPeer) {
  auto server = [](RoleEnv& env) {
    // Fork mode: find a free port, close it again and hand it over. Split
    // mode: the client's agreed port simply has no listener.
    if (HarnessConfig::get().mode != RoleMode::kFork) return;
    auto ctx = env.open_context();
    uint16_t port = 0;
    {
      auto listener = ctx->listen(env.listen_address());
      port = listener->port();
    }
    env.publish_port(port);
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    const std::string address = env.server_address();
    auto cq = ctx->create_cq();
    QpOptions options = test_qp_options();
    options.send_cq = cq.get();
    options.recv_cq = cq.get();
    const auto start = Clock::now();
    try {
      auto qp = ctx->connect(address, options, {}, milliseconds(3000));
      ADD_FAILURE() << "connect to " << address << " succeeded";
    } catch (const Error& e) {
      const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
      EXPECT_TRUE(e.sys_errno() == ECONNREFUSED || e.sys_errno() == ETIMEDOUT)
          << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find(env.provider()), std::string::npos) << what;
      EXPECT_NE(what.find(address), std::string::npos) << what;
      EXPECT_EQ(e.peer(), address);
      EXPECT_EQ(e.provider(), env.provider());
      EXPECT_LE(took, milliseconds(3500)) << "connect ignored its timeout";
      if (e.sys_errno() == ECONNREFUSED) {
        EXPECT_LE(took, milliseconds(1000)) << "a refusal should be quick";
      }
    }
  };
  run(server, client);
}

TEST_P(ConnectTest, PrivateDataTravelsBothWays) {
  auto server = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto listener = env.listen(*ctx);
    std::vector<std::byte> reply(Context::kMaxPrivateData);
    fill_pattern(reply.data(), Context::kMaxPrivateData, 11);
    Endpoint full = accept_endpoint(*ctx, *listener, test_qp_options(), reply);
    const auto got = full.qp->peer_private_data();
    EXPECT_EQ(got.size(), Context::kMaxPrivateData);
    EXPECT_TRUE(
        check_pattern(got.data(), std::min(got.size(), Context::kMaxPrivateData), 12));
    Endpoint empty = accept_endpoint(*ctx, *listener);
    EXPECT_EQ(empty.qp->peer_private_data().size(), 0u);
    Buffer recv = make_buffer(*ctx, MemKind::kAllocated, 64, kAccessLocalWrite);
    ASSERT_TRUE(post(*empty.qp, recv_wr(1, *recv.mr, 0, 64)));
    Completion c;
    ASSERT_TRUE(wait_one(*empty.recv_cq, &c));
    EXPECT_EQ(c.status, Status::kSuccess);
  };
  auto client = [](RoleEnv& env) {
    auto ctx = env.open_context();
    auto cq = ctx->create_cq();
    QpOptions options = test_qp_options();
    options.send_cq = cq.get();
    options.recv_cq = cq.get();
    std::vector<std::byte> too_big(Context::kMaxPrivateData + 1);
    try {
      auto qp = env.connect(*ctx, options, too_big);
      ADD_FAILURE() << "connect accepted " << too_big.size() << " bytes of private data";
    } catch (const Error& e) {
      EXPECT_EQ(e.sys_errno(), EINVAL) << e.what();
    }
    std::vector<std::byte> data(Context::kMaxPrivateData);
    fill_pattern(data.data(), Context::kMaxPrivateData, 12);
    Endpoint full = connect_endpoint(env, *ctx, test_qp_options(), data);
    const auto got = full.qp->peer_private_data();
    EXPECT_EQ(got.size(), Context::kMaxPrivateData);
    EXPECT_TRUE(
        check_pattern(got.data(), std::min(got.size(), Context::kMaxPrivateData), 11));
    Endpoint empty = connect_endpoint(env, *ctx);
    EXPECT_EQ(empty.qp->peer_private_data().size(), 0u);
    Buffer local = make_buffer(*ctx, MemKind::kAllocated, 64, kAccessLocalWrite);
    ASSERT_TRUE(post(*empty.qp, send_wr(1, *local.mr, 0, 8)));
    Completion c;
    ASSERT_TRUE(wait_one(*empty.send_cq, &c));
    EXPECT_EQ(c.status, Status::kSuccess);
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::test
