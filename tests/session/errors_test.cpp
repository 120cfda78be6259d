// Bad requests get errors naming what was asked and why; nothing aborts.
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

using rdmakit::test::ProviderTest;

class SessionErrorsTest : public ProviderTest {};
RDMAKIT_INSTANTIATE_PROVIDERS(SessionErrorsTest);

::testing::AssertionResult mentions(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << text << "' does not mention '" << part << "'";
}

SessionOptions local_options(const std::string& provider) {
  SessionOptions o;
  o.provider = parse_provider(provider);
  o.connect_timeout = 300ms;
  return o;
}

TEST_P(SessionErrorsTest, RefusedConnectionRetriesThenNamesTheAddress) {
  Client c(local_options(GetParam()));
  // Nobody listens there (a listener bound and closed again frees the port).
  uint16_t port = 0;
  {
    ContextOptions co;
    co.provider = parse_provider(GetParam());
    auto probe = Context::open(co);
    port = probe->listen("127.0.0.1:0")->port();
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const auto start = Clock::now();
  try {
    c.connect(address);
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_EQ(e.sys_errno(), ECONNREFUSED) << e.what();
    EXPECT_TRUE(mentions(e.what(), address));
    EXPECT_TRUE(mentions(e.what(), "attempts"));  // it retried with backoff
    EXPECT_EQ(e.provider(), GetParam());
  }
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_LT(Clock::now() - start, 3s);
}

TEST_P(SessionErrorsTest, MalformedAddress) {
  Client c(local_options(GetParam()));
  EXPECT_THROW(c.connect("no-port-here"), Error);
  EXPECT_THROW(c.connect("256.1.1.1:70000"), Error);
}

TEST_P(SessionErrorsTest, BadOptionsAreRejected) {
  SessionOptions o = local_options(GetParam());
  o.channels.clear();
  EXPECT_THROW(Client{o}, Error);
  o = local_options(GetParam());
  o.recv_depth = 1;
  EXPECT_THROW(Client{o}, Error);
  o = local_options(GetParam());
  o.liveness = o.heartbeat;
  EXPECT_THROW(Client{o}, Error);
  EXPECT_THROW(parse_thread_mode("threads"), Error);
  EXPECT_THROW(parse_event_mode("poll"), Error);
}

// Remote mistakes: a buffer that does not exist, an out-of-range access, a
// message too large for the peer; the endpoint stays usable after each.
// Two named channels on one endpoint, each its own QP.
TEST_P(SessionErrorsTest, RemoteMistakesAndTwoChannels) {
  auto server = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    o.channels = {"ctl", "bulk"};
    std::atomic<int> closes{0};
    Handlers h;
    h.on_message = [](Channel& ch, Message& m) {
      EXPECT_TRUE(ch.send(ch.name() + ":" + std::string(m.text())).ok());
    };
    h.on_disconnect = [&](Endpoint&, const DisconnectInfo&) { ++closes; };
    Server s(env.listen_address(), o, h);
    s.expose("small", 4096);
    s.expose("ro", 4096, kAccessRemoteRead);
    s.start();
    env.publish_port(s.port());
    ASSERT_TRUE(serve_until(s, o, [&] { return closes.load() == 1; }));
  };
  auto client = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    o.channels = {"ctl", "bulk"};
    Client c(o);
    Endpoint& ep = c.connect(env.server_address());
    ASSERT_EQ(ep.channel_count(), 2u);
    ASSERT_NE(ep.channel("bulk"), nullptr);
    EXPECT_EQ(ep.channel("nope"), nullptr);
    auto buf = c.context().allocate(8192, kAccessLocalWrite);
    Channel& ch = ep.channel(0);

    OpResult r = ch.write_sync("missing", 0, Local::of(*buf), 16);
    EXPECT_EQ(r.code, Errc::kNoSuchBuffer);
    EXPECT_TRUE(mentions(r.detail, "'missing'"));
    EXPECT_TRUE(mentions(r.detail, "'small'"));  // what the peer does expose
    EXPECT_TRUE(mentions(r.detail, env.provider()));

    r = ch.write_sync("small", 4000, Local::of(*buf), 200);
    EXPECT_EQ(r.code, Errc::kOutOfRange);
    EXPECT_TRUE(mentions(r.detail, "4096 bytes"));

    r = ch.read_sync("small", 0, Local::of(*buf), 8192 + 1);
    EXPECT_NE(r.code, Errc::kOk);

    r = ch.send(std::string(ch.max_message() + 1, 'x'));
    EXPECT_EQ(r.code, Errc::kTooLarge);
    EXPECT_TRUE(mentions(r.detail, std::to_string(ch.max_message())));

    // Still usable, on both channels.
    for (const char* name : {"ctl", "bulk"}) {
      Channel& c2 = *ep.channel(name);
      ASSERT_TRUE(c2.send("ping").ok());
      Message m;
      ASSERT_TRUE(c2.recv(&m, scaled(10000ms)).ok());
      EXPECT_EQ(m.text(), std::string(name) + ":ping");
    }
    r = ch.write_sync("small", 0, Local::of(*buf), 4096);
    EXPECT_TRUE(r.ok()) << r.detail;

    // A WRITE into a read-only buffer fails at the target, names the status,
    // and takes the endpoint down (the QP is in error, as on a NIC).
    r = ch.write_sync("ro", 0, Local::of(*buf), 64);
    EXPECT_EQ(r.code, Errc::kTransport);
    EXPECT_EQ(r.status, Status::kRemoteAccessError) << r.detail;
    EXPECT_TRUE(mentions(r.detail, "REMOTE_ACCESS_ERROR"));
    const auto until = Clock::now() + 5s;
    while (!ep.closed() && Clock::now() < until) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(ep.closed());
    EXPECT_EQ(ep.disconnect_info().reason, DisconnectReason::kTransportError);
  };
  run(server, client);
}

// A name resolved once into a RemoteBuffer; write_batch over several post
// lists with one callback; WRITEs without a callback (selectively signaled)
// ordered before a later completion; mistakes on handles named as on names.
TEST_P(SessionErrorsTest, ResolvedBuffersBatchesAndQuietWrites) {
  static constexpr size_t kBoard = 64 * 1024;
  auto server = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    std::atomic<int> closes{0};
    Handlers h;
    h.on_disconnect = [&](Endpoint&, const DisconnectInfo&) { ++closes; };
    Server s(env.listen_address(), o, h);
    s.expose("board", kBoard);
    s.start();
    env.publish_port(s.port());
    ASSERT_TRUE(serve_until(s, o, [&] { return closes.load() == 1; }));
  };
  auto client = [](RoleEnv& env) {
    SessionOptions o = options_for(env);
    Client c(o);
    Endpoint& ep = c.connect(env.server_address());
    Channel& ch = ep.channel(0);
    auto src = c.context().allocate(kBoard, kAccessLocalWrite);
    auto dst = c.context().allocate(kBoard, kAccessLocalWrite);

    EXPECT_FALSE(ch.remote("nope"));
    RemoteBuffer none;
    OpResult r = ch.resolve("nope", &none);
    EXPECT_EQ(r.code, Errc::kNoSuchBuffer);
    EXPECT_TRUE(mentions(r.detail, "'nope'"));
    EXPECT_TRUE(mentions(r.detail, "'board'"));
    r = ch.write(none, 0, Local::of(*src), 16);
    EXPECT_EQ(r.code, Errc::kNoSuchBuffer);

    const RemoteBuffer board = ch.remote("board");
    ASSERT_TRUE(board);
    EXPECT_EQ(board.name(), "board");
    EXPECT_EQ(board.length(), kBoard);
    r = ch.write(board, kBoard - 8, Local::of(*src), 16);
    EXPECT_EQ(r.code, Errc::kOutOfRange);
    EXPECT_TRUE(mentions(r.detail, "'board'"));

    // 40 segments of 1 KiB: two post lists; one callback for all.
    for (size_t i = 0; i < kBoard; ++i) src->data()[i] = std::byte(i * 7 + 1);
    std::vector<WriteSegment> segs;
    for (uint64_t i = 0; i < 40; ++i) {
      segs.push_back({.offset = i * 1024,
                      .src = Local{src->data() + i * 1024, 1024, src->lkey()},
                      .length = 1024});
    }
    std::vector<WriteSegment> bad = segs;
    bad.back().offset = kBoard;
    r = ch.write_batch(board, bad);
    EXPECT_EQ(r.code, Errc::kOutOfRange);
    std::atomic<int> done{0};
    r = ch.write_batch(board, segs, [&](const OpResult& res) {
      EXPECT_TRUE(res.ok()) << res.detail;
      ++done;
    });
    ASSERT_TRUE(r.ok()) << r.detail;
    const auto until = Clock::now() + scaled(10000ms);
    while (done.load() == 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(done.load(), 1);

    // 50 WRITEs without a callback, then one with: its completion covers them.
    for (uint64_t i = 0; i < 50; ++i) {
      r = ch.write(board, 40 * 1024 + i * 64,
                   Local{src->data() + 40 * 1024 + i * 64, 64, src->lkey()}, 64);
      ASSERT_TRUE(r.ok()) << r.detail;
    }
    r = ch.write_sync("board", kBoard - 1024,
                      Local{src->data() + kBoard - 1024, 1024, src->lkey()}, 1024);
    ASSERT_TRUE(r.ok()) << r.detail;
    r = ch.read_sync("board", 0, Local::of(*dst), 40 * 1024 + 50 * 64);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(std::memcmp(dst->data(), src->data(), 40 * 1024 + 50 * 64), 0);
  };
  run(server, client);
}

}  // namespace
}  // namespace rdmakit::session::test
