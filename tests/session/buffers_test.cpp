// Buffers a server exposes to each peer alone (Server::expose_per_endpoint):
// every endpoint gets its own region, seen by its peer only and reached on
// the server side through Endpoint::local_buffer.
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "conformance.hpp"
#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

using rdmakit::test::ProviderTest;
using rdmakit::test::RunOptions;

class SessionBuffersTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SessionBuffersTest);

constexpr size_t kInbox = 4096;
constexpr size_t kTag = 16;

TEST_P(SessionBuffersTest, PerEndpointBuffersAreEachPeersOwn) {
  auto server = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    std::mutex mu;
    // Inboxes of the endpoints connected now: each its own region. (A closed
    // endpoint's region may be freed and its address reused by the next.)
    std::set<const std::byte*> inboxes;
    std::atomic<int> connects{0};
    std::atomic<int> closes{0};
    Handlers h;
    h.on_connect = [&](Endpoint& ep) {
      MemoryRegion* inbox = ep.local_buffer("inbox");
      EXPECT_NE(inbox, nullptr);
      EXPECT_EQ(ep.local_buffer("shared"), nullptr);  // not per endpoint
      if (inbox != nullptr) {
        EXPECT_EQ(inbox->length(), kInbox);
        std::lock_guard lock(mu);
        EXPECT_TRUE(inboxes.insert(inbox->data()).second)
            << "two connected endpoints share one inbox";
      }
      ++connects;
    };
    // "check": answers with what this peer wrote into its own inbox.
    h.on_message = [](Channel& ch, Message& m) {
      EXPECT_EQ(m.text(), "check");
      const MemoryRegion* inbox = ch.endpoint().local_buffer("inbox");
      ASSERT_NE(inbox, nullptr);
      const auto* text = reinterpret_cast<const char*>(inbox->data());
      EXPECT_TRUE(ch.send(std::string_view(text, strnlen(text, kTag))).ok());
    };
    h.on_disconnect = [&](Endpoint& ep, const DisconnectInfo&) {
      if (MemoryRegion* inbox = ep.local_buffer("inbox"); inbox != nullptr) {
        std::lock_guard lock(mu);
        inboxes.erase(inbox->data());
      }
      ++closes;
    };
    Server s(env.listen_address(), o, h);
    s.expose("shared", 64);
    s.expose_per_endpoint("inbox", kInbox);
    try {
      s.expose_per_endpoint("shared", 64);
      ADD_FAILURE() << "a taken name was exposed again";
    } catch (const Error& e) {
      EXPECT_EQ(e.sys_errno(), EEXIST) << e.what();
    }
    EXPECT_THROW(s.expose_per_endpoint("empty", 0), Error);
    s.start();
    env.publish_port(s.port());
    ASSERT_TRUE(serve_until(s, o, [&] { return closes.load() == env.clients(); }));
    EXPECT_EQ(connects.load(), env.clients());
  };
  auto client = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    Client c(o);
    Endpoint& ep = c.connect(env.server_address());
    ASSERT_TRUE(ep.remote_buffer("shared"));
    const std::optional<RemoteRegion> inbox = ep.remote_buffer("inbox");
    ASSERT_TRUE(inbox);
    EXPECT_EQ(inbox->length, kInbox);
    auto src = c.context().allocate(kTag, kAccessLocalWrite);
    const std::string tag = "client-" + std::to_string(env.client_index());
    std::memcpy(src->data(), tag.data(), tag.size());
    Channel& ch = ep.channel();
    // Both clients write at offset 0: with one shared buffer they would
    // overwrite each other.
    for (int round = 0; round < 20; ++round) {
      OpResult r = ch.write_sync("inbox", 0, Local::of(*src), kTag);
      ASSERT_TRUE(r.ok()) << r.detail;
      ASSERT_TRUE(ch.send("check").ok());
      Message m;
      r = ch.recv(&m, scaled(10000ms));
      ASSERT_TRUE(r.ok()) << r.detail;
      EXPECT_EQ(m.text(), tag);
    }
  };
  RunOptions ro;
  ro.clients = 2;
  run(server, client, ro);
}

}  // namespace
}  // namespace rdmakit::session::test
