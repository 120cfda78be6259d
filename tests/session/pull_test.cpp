// Pulled messages in application mode: the message that arrives while recv()
// polls is handed to it directly, the others queue in the inbox; either way
// they come out in the order sent, and a Message reused for the next recv()
// gives its receive slot back.
//
// The code before the direct hand-off passes every message through the
// inbox and so keeps the order: no order check can fail on it, and the
// hand-off itself (no inbox pass) is a cost, measured in bench/, not visible
// through the API. What the checks catch is a wrong hand-off (each tried):
// one that looks at the inbox only after a poll pass fails the bursts by
// order; one that skips the inbox fails the bursts by a timeout, and the
// second phase by order at once.
#include <string>
#include <thread>

#include "conformance.hpp"
#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

using rdmakit::test::ProviderTest;

class SessionPullTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SessionPullTest);

TEST_P(SessionPullTest, DirectAndQueuedMessagesKeepTheirOrder) {
  auto server = [](RoleEnv& env) {
    SessionOptions o = options_for(env, ThreadMode::kApplication, EventMode::kBusyPoll);
    std::atomic<int> gone{0};
    Handlers h;
    h.on_message = [](Channel& ch, Message& m) { EXPECT_TRUE(ch.send(m.data()).ok()); };
    h.on_disconnect = [&](Endpoint&, const DisconnectInfo&) { ++gone; };
    Server s(env.listen_address(), o, h);
    s.start();
    env.publish_port(s.port());
    ASSERT_TRUE(serve_until(s, o, [&] { return gone.load() == 1; }));
  };
  auto client = [](RoleEnv& env) {
    SessionOptions o = options_for(env, ThreadMode::kApplication, EventMode::kBusyPoll);
    Client c(o);
    Channel& ch = c.connect(env.server_address()).channel();
    Message m;  // reused: each recv() releases the previous message
    int next = 0;
    // Bursts of 1 to depth/2 (the echoes of a burst arrive together, so all
    // but the first wait in the inbox), 40 times the depth in all.
    for (int burst = 1, sent = 0; sent < 40 * 16; burst = burst % 8 + 1) {
      for (int i = 0; i < burst; ++i) ASSERT_TRUE(ch.send(std::to_string(sent + i)).ok());
      sent += burst;
      for (int i = 0; i < burst; ++i) {
        const OpResult r = ch.recv(&m, scaled(10000ms));
        ASSERT_TRUE(r.ok()) << r.detail;
        ASSERT_EQ(m.text(), std::to_string(next++));
      }
    }
    // A recv() while an older message waits in the inbox and a newer one
    // arrives during its poll. The code before the direct hand-off passes
    // every message through the inbox, so order checks alone cannot fail
    // on it; what they catch is a hand-off that skips the inbox: such a
    // recv() would be handed the newer message first, whether it skips the
    // inbox altogether or looks at it only after a poll pass. progress()
    // between the sends queues the older echo in the inbox (no recv() waits).
    for (int round = 0; round < 50; ++round) {
      const int first = next;
      ASSERT_TRUE(ch.send(std::to_string(first)).ok());
      ASSERT_TRUE(ch.send(std::to_string(first + 1)).ok());
      OpResult r = ch.recv(&m, scaled(10000ms));
      ASSERT_TRUE(r.ok()) << r.detail;
      ASSERT_EQ(m.text(), std::to_string(next++));
      for (int i = 0; i < 5; ++i) c.progress(2ms);  // first + 1 -> the inbox
      ASSERT_TRUE(ch.send(std::to_string(first + 2)).ok());
      // Its echo waits in the CQ (nothing polls it): the next recv()'s first
      // poll pass meets it while first + 1 is in the inbox.
      std::this_thread::sleep_for(5ms);
      for (int i = 0; i < 2; ++i) {
        r = ch.recv(&m, scaled(10000ms));
        ASSERT_TRUE(r.ok()) << r.detail;
        ASSERT_EQ(m.text(), std::to_string(next++)) << "round " << round;
      }
    }
    c.endpoint().close();
    c.progress(1ms);
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::session::test
