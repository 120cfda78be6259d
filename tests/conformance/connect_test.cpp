// Connecting to a port nobody listens on fails fast with a useful Error.
#include <cerrno>
#include <string>

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

}  // namespace
}  // namespace rdmakit::test
