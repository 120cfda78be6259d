// Every thread mode x event mode carries traffic on every provider: copy and
// zero-copy messages (echoed), WRITE/READ of a named buffer, WRITE_WITH_IMM
// notifications, a credit-limited burst, and a clean disconnect.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

using Param = std::tuple<std::string, ThreadMode, EventMode>;

class SessionModesTest : public ::testing::TestWithParam<Param> {};

constexpr int kEchoes = 50;
constexpr int kBurst = 600;  // >> recv_depth: the sender runs out of credits
constexpr size_t kMem = 64 * 1024;

struct ServerState {
  std::atomic<int> burst_seen{0};
  std::atomic<bool> burst_in_order{true};
  std::atomic<int> disconnects{0};
  std::atomic<int> reason{-1};
};

Handlers echo_handlers(ServerState& st) {
  Handlers h;
  h.on_message = [&st](Channel& ch, Message& m) {
    if (m.is_notification()) {
      EXPECT_TRUE(
          ch.send("imm:" + std::to_string(m.imm()) + ":" + std::to_string(m.written()))
              .ok());
      return;
    }
    const std::string_view t = m.text();
    if (t.starts_with("b:")) {
      // Burst: counted, not echoed; now and then slow, so credits run out.
      const int n = std::stoi(std::string(t.substr(2)));
      if (n != st.burst_seen.load()) st.burst_in_order = false;
      if (++st.burst_seen % 128 == 0) std::this_thread::sleep_for(2ms);
      return;
    }
    if (t == "b-end") {
      EXPECT_TRUE(ch.send("b-count:" + std::to_string(st.burst_seen.load()) +
                          (st.burst_in_order ? ":ordered" : ":disordered"))
                      .ok());
      return;
    }
    const OpResult r = ch.send(m.data());
    EXPECT_TRUE(r.ok()) << r.detail;
  };
  h.on_disconnect = [&st](Endpoint&, const DisconnectInfo& info) {
    st.reason = static_cast<int>(info.reason);
    ++st.disconnects;
  };
  return h;
}

void expect_reply(Channel& ch, std::string_view want) {
  Message m;
  const OpResult r = ch.recv(&m, scaled(10000ms));
  ASSERT_TRUE(r.ok()) << r.detail;
  EXPECT_EQ(m.text(), want);
}

TEST_P(SessionModesTest, TrafficAndCleanClose) {
  const auto [provider, tm, em] = GetParam();
  auto server = [tm = tm, em = em](RoleEnv& env) {
    ServerState st;
    const SessionOptions o = options_for(env, tm, em);
    Server s(env.listen_address(), o, echo_handlers(st));
    MemoryRegion& mem = s.expose("mem", kMem);
    s.start();
    env.publish_port(s.port());
    ASSERT_TRUE(serve_until(s, o, [&] { return st.disconnects.load() == 1; }));
    EXPECT_EQ(st.reason.load(), static_cast<int>(DisconnectReason::kPeerClosed));
    EXPECT_EQ(std::to_integer<int>(mem.data()[5]), 5 * 7 % 251);  // the client's WRITE
  };
  auto client = [tm = tm, em = em](RoleEnv& env) {
    const SessionOptions o = options_for(env, tm, em);
    Client c(o);
    Endpoint& ep = c.connect(env.server_address());
    Channel& ch = ep.channel();
    ASSERT_TRUE(ep.connected());
    ASSERT_TRUE(ep.remote_buffer("mem").has_value());

    for (int i = 0; i < kEchoes; ++i) {
      const std::string msg = "echo " + std::to_string(i);
      const OpResult r = ch.send(msg);
      ASSERT_TRUE(r.ok()) << r.detail;
      expect_reply(ch, msg);
    }

    // Zero copy from a pool buffer; the buffer goes back to its pool.
    BufferPool pool(c.context(), {{256, 4}, {2048, 2}});
    {
      Buffer b = pool.get(200);
      ASSERT_TRUE(b);
      std::memset(b.data(), 'z', 200);
      b.resize(200);
      ASSERT_TRUE(ch.send(std::move(b)).ok());
      expect_reply(ch, std::string(200, 'z'));
    }
    const auto pool_deadline = Clock::now() + 5s;
    while (pool.available(0) != 4 && Clock::now() < pool_deadline) {
      if (tm == ThreadMode::kApplication) c.progress(1ms);
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(pool.available(0), 4u);

    // One-sided: WRITE the server's named buffer, READ it back.
    auto src = c.context().allocate(kMem, kAccessLocalWrite);
    auto dst = c.context().allocate(kMem, kAccessLocalWrite);
    for (size_t i = 0; i < kMem; ++i) src->data()[i] = std::byte(i * 7 % 251);
    OpResult r = ch.write_sync("mem", 0, Local::of(*src), kMem);
    ASSERT_TRUE(r.ok()) << r.detail;
    r = ch.read_sync("mem", 0, Local::of(*dst), kMem);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), kMem), 0);

    // Notification: WRITE_WITH_IMM reaches the server's handler.
    r = ch.write_with_imm_sync("mem", 0, Local::of(*src), 64, 77);
    ASSERT_TRUE(r.ok()) << r.detail;
    expect_reply(ch, "imm:77:64");

    // A burst far beyond the peer's receive depth: credits, never RNR.
    for (int i = 0; i < kBurst; ++i) {
      r = ch.send("b:" + std::to_string(i));
      ASSERT_TRUE(r.ok()) << "burst message " << i << ": " << r.detail;
    }
    ASSERT_TRUE(ch.send("b-end").ok());
    expect_reply(ch, "b-count:" + std::to_string(kBurst) + ":ordered");
  };  // ~Client: clean close
  rdmakit::test::run_roles(provider, server, client);
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const auto& p : rdmakit::test::providers_from_env()) {
    for (ThreadMode tm : {ThreadMode::kPollerPerEndpoint, ThreadMode::kSharedWorkers,
                          ThreadMode::kApplication}) {
      for (EventMode em :
           {EventMode::kBusyPoll, EventMode::kBlocking, EventMode::kEpollFd}) {
        out.emplace_back(p, tm, em);
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, SessionModesTest, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_" +
                                  thread_mode_name(std::get<1>(info.param)) + "_" +
                                  event_mode_name(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace rdmakit::session::test
