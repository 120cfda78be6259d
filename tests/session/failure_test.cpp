// Peer failures reach on_disconnect with a reason within the liveness bound,
// every pending operation completes (with an error), and the server keeps
// serving its other endpoints.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

using rdmakit::test::ProviderTest;
using rdmakit::test::RunOptions;

class SessionFailureTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SessionFailureTest);

constexpr size_t kMem = 256 * 1024;
constexpr size_t kChunk = 16 * 1024;

// Detection bound: liveness (heartbeat silence) or the transport's
// peer_timeout, plus slack for a loaded machine.
std::chrono::milliseconds detection_bound() { return scaled(1000ms) + scaled(3000ms); }

void expect_failure_reason(int reason) {
  EXPECT_TRUE(reason == static_cast<int>(DisconnectReason::kTransportError) ||
              reason == static_cast<int>(DisconnectReason::kPeerSilent))
      << "reason " << reason;
}

// Streams WRITEs to the peer's "mem" until the endpoint closes; counts
// callbacks. Returns once every posted WRITE has completed (or the limit).
struct Streamer {
  std::atomic<int> outstanding{0};
  std::atomic<int> failed{0};
  std::atomic<int> succeeded{0};
  std::atomic<int> late_success{0};  // succeeded after the endpoint closed

  void run(Endpoint& ep, Context& ctx, const std::function<void()>& progress,
           bool expect_progress) {
    auto src = ctx.allocate(kChunk, kAccessLocalWrite);
    Channel& ch = ep.channel();
    uint64_t next = 0;
    const auto limit = Clock::now() + scaled(20000ms);
    while (!ep.closed() && Clock::now() < limit) {
      if (outstanding.load() < 8) {
        ++outstanding;
        const OpResult r = ch.write("mem", (next++ * kChunk) % kMem, Local::of(*src),
                                    kChunk, [this, &ep](const OpResult& res) {
                                      if (res.ok()) {
                                        ++succeeded;
                                        if (ep.closed()) ++late_success;
                                      } else {
                                        ++failed;
                                        EXPECT_FALSE(res.detail.empty());
                                      }
                                      --outstanding;
                                    });
        if (!r.ok()) {
          --outstanding;
          EXPECT_EQ(r.code, Errc::kClosed) << errc_name(r.code) << ": " << r.detail;
        }
      }
      progress();
    }
    EXPECT_TRUE(ep.closed()) << "the peer's failure was never noticed";
    // on_disconnect runs after pending operations failed: nothing outstanding.
    const auto drain = Clock::now() + 2s;
    while (outstanding.load() != 0 && Clock::now() < drain) progress();
    EXPECT_EQ(outstanding.load(), 0) << "pending operations never completed";
    EXPECT_EQ(late_success.load(), 0);
    if (expect_progress) {
      EXPECT_GT(succeeded.load(), 0) << "the stream was not running";
    }
  }
};

// The server SIGKILLs itself mid-stream; the client's pending WRITEs all
// complete, on_disconnect reports TRANSPORT_ERROR or PEER_SILENT in bound,
// and later operations say the endpoint is closed and why.
TEST_P(SessionFailureTest, ServerKilledPendingOpsFail) {
  auto server = [](RoleEnv& env) {
    const SessionOptions o = options_for(env);
    Handlers h;
    h.on_message = [](Channel&, Message& m) {
      if (m.text() == "die") {
        std::this_thread::sleep_for(50ms);  // let the stream run
        ::raise(SIGKILL);
      }
    };
    Server s(env.listen_address(), o, h);
    s.expose("mem", kMem);
    s.start();
    env.publish_port(s.port());
    std::this_thread::sleep_for(scaled(20000ms));
    ADD_FAILURE() << "never told to die";
  };
  auto client = [](RoleEnv& env) {
    std::atomic<int> reason{-1};
    std::atomic<bool> disconnected{false};
    Clock::time_point died_at{};
    Handlers h;
    h.on_disconnect = [&](Endpoint&, const DisconnectInfo& info) {
      reason = static_cast<int>(info.reason);
      disconnected = true;
    };
    SessionOptions o = options_for(env);
    Client c(o, h);
    Endpoint& ep = c.connect(env.server_address());
    ASSERT_TRUE(ep.channel().send("die").ok());
    died_at = Clock::now();
    Streamer st;
    st.run(
        ep, c.context(), [] { std::this_thread::sleep_for(100us); }, true);
    EXPECT_LT(Clock::now() - died_at, detection_bound() + 100ms);
    const auto until = Clock::now() + 5s;
    while (!disconnected.load() && Clock::now() < until) std::this_thread::sleep_for(1ms);
    expect_failure_reason(reason.load());
    EXPECT_TRUE(disconnected.load());
    const OpResult r = ep.channel().send("after");
    EXPECT_EQ(r.code, Errc::kClosed);
    EXPECT_NE(r.detail.find("endpoint closed"), std::string::npos) << r.detail;
  };
  RunOptions ro;
  ro.server_may_be_killed = true;
  run(server, client, ro);
}

// Two clients: the first is SIGKILLed (or SIGSTOPped: silent); the server sees
// it go with a failure reason, in bound, fails its pending operations, and
// still serves the second client.
void victim_and_survivor(const std::string& provider, int signal_number) {
  auto server = [](RoleEnv& env) {
    const SessionOptions o = options_for(env);
    std::mutex mu;
    std::vector<std::shared_ptr<Endpoint>> eps;
    std::shared_ptr<Endpoint> victim;
    std::atomic<int> reason{-1};
    std::atomic<int> clean_closes{0};
    Clock::time_point victim_told{};
    std::atomic<bool> victim_gone{false};
    std::atomic<int> echoed{0};
    Handlers h;
    h.on_connect = [&](Endpoint& ep) {
      std::lock_guard lock(mu);
      eps.push_back(ep.shared_from_this());
    };
    h.on_message = [&](Channel& ch, Message& m) {
      const std::string t(m.text());
      if (t.starts_with("victim:")) {
        std::lock_guard lock(mu);
        victim = ch.endpoint().shared_from_this();
      } else {
        EXPECT_TRUE(ch.send(m.data()).ok());  // echo
        ++echoed;
      }
    };
    h.on_disconnect = [&](Endpoint& ep, const DisconnectInfo& info) {
      if (victim.get() == &ep) {
        reason = static_cast<int>(info.reason);
        victim_gone = true;
        std::lock_guard lock(mu);
        for (auto& other : eps) {
          if (other.get() != &ep && other->connected()) {
            EXPECT_TRUE(other->channel().send("victim-gone").ok());
          }
        }
      } else if (info.reason == DisconnectReason::kPeerClosed) {
        ++clean_closes;
      }
    };
    Server s(env.listen_address(), o, h);
    s.expose("mem", kMem);
    s.start();
    env.publish_port(s.port());
    // The survivor's "hello" is echoed before the victim goes, so that its
    // echo cannot arrive after "victim-gone" (two progress threads send).
    ASSERT_TRUE(serve_until(s, o, [&] {
      std::lock_guard lock(mu);
      return victim != nullptr && eps.size() == 2 && echoed.load() >= 1;
    }));
    std::shared_ptr<Endpoint> v;
    {
      std::lock_guard lock(mu);
      v = victim;
    }
    // Tell the victim to go; stream WRITEs into it meanwhile.
    ASSERT_TRUE(v->channel().send("go").ok());
    victim_told = Clock::now();
    Streamer st;
    st.run(
        *v, s.context(), [] { std::this_thread::sleep_for(100us); }, false);
    EXPECT_LT(Clock::now() - victim_told, detection_bound() + 200ms);
    // on_disconnect runs on the endpoint's progress thread just after the
    // endpoint reports closed().
    EXPECT_TRUE(serve_until(
        s, o, [&] { return victim_gone.load(); }, 5s));
    expect_failure_reason(reason.load());
    // The survivor finishes its echo and closes cleanly.
    EXPECT_TRUE(serve_until(s, o, [&] { return clean_closes.load() == 1; }));
  };
  auto client = [signal_number](RoleEnv& env) {
    const SessionOptions o = options_for(env);
    Client c(o);
    c.expose("mem", kMem);  // the server streams WRITEs into the victim
    Endpoint& ep = c.connect(env.server_address());
    if (env.client_index() == 0) {
      ASSERT_TRUE(ep.channel().send("victim:" + std::to_string(::getpid())).ok());
      Message m;
      ASSERT_TRUE(ep.channel().recv(&m, scaled(20000ms)).ok());
      ASSERT_EQ(m.text(), "go");
      m.release();
      std::fflush(nullptr);
      if (signal_number == SIGSTOP) {
        // A stopped process cannot end itself, and in split mode the server
        // runs on another host: a helper process ends it after the test.
        const pid_t stopped = ::getpid();
        if (::fork() == 0) {
          ::usleep(static_cast<useconds_t>(2 * scaled(1000ms).count() + 1000) * 1000);
          ::kill(stopped, SIGKILL);
          _exit(0);
        }
      }
      ::raise(signal_number);
      std::this_thread::sleep_for(30s);  // SIGSTOP: the server kills us
      return;
    }
    ASSERT_TRUE(ep.channel().send("hello").ok());
    Message m;
    ASSERT_TRUE(ep.channel().recv(&m, scaled(10000ms)).ok());
    EXPECT_EQ(m.text(), "hello");
    m.release();
    ASSERT_TRUE(ep.channel().recv(&m, scaled(20000ms)).ok());
    EXPECT_EQ(m.text(), "victim-gone");
    m.release();
    // Still served after the other endpoint died.
    ASSERT_TRUE(ep.channel().send("still here").ok());
    ASSERT_TRUE(ep.channel().recv(&m, scaled(10000ms)).ok());
    EXPECT_EQ(m.text(), "still here");
  };
  RunOptions ro;
  ro.clients = 2;
  ro.client_may_be_killed = true;
  rdmakit::test::run_roles(provider, server, client, ro);
}

TEST_P(SessionFailureTest, ClientKilledServerKeepsServing) {
  victim_and_survivor(GetParam(), SIGKILL);
}

TEST_P(SessionFailureTest, ClientStoppedServerKeepsServing) {
  victim_and_survivor(GetParam(), SIGSTOP);
}

}  // namespace
}  // namespace rdmakit::session::test
