// Connection setup: a handshake cut short is retried within connect_timeout,
// and the session's log lines go to stderr, never to stdout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "session_test_util.hpp"

namespace rdmakit::session::test {
namespace {

std::string slurp(FILE* f) {
  std::string text;
  std::rewind(f);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  return text;
}

// A tcp "server" that takes the first connection, reads a little of its
// handshake and hangs up (as a server whose accept window closed under the
// request does), then gives its port to a real session server.
TEST(SessionConnect, RetriesAHandshakeCutShort) {
  const int raw = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(raw, 0);
  const int one = 1;
  ::setsockopt(raw, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(raw, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(raw, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(raw, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  std::atomic<bool> cut{false};
  std::atomic<bool> done{false};
  std::thread server([&] {
    const int conn = ::accept4(raw, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn >= 0) {
      char some[8];
      (void)::recv(conn, some, sizeof some, 0);
      ::close(conn);  // unread handshake bytes: the client sees a reset
      cut = true;
    }
    ::close(raw);
    SessionOptions o;
    o.provider = ProviderKind::kTcp;
    o.thread_mode = ThreadMode::kPollerPerEndpoint;
    Server s(address, o, {});
    s.start();
    while (!done.load()) std::this_thread::sleep_for(5ms);
  });
  SessionOptions o;
  o.provider = ProviderKind::kTcp;
  o.thread_mode = ThreadMode::kApplication;
  o.connect_timeout = scaled(10000ms);
  {
    Client c(o);
    try {
      Endpoint& ep = c.connect(address);
      EXPECT_TRUE(ep.connected());
      EXPECT_TRUE(ep.channel().send("after a cut handshake").ok());
    } catch (const Error& e) {
      ADD_FAILURE() << "connect did not retry the cut handshake: " << e.what();
    }
  }
  EXPECT_TRUE(cut.load());
  done = true;
  server.join();
}

TEST(SessionConnect, LogsGoToStderrNotStdout) {
  // This test's own choice of level, whatever RDMAKIT_LOG says (the
  // session's logger follows the application's spdlog level).
  SessionOptions o;
  o.provider = ProviderKind::kTcp;
  o.thread_mode = ThreadMode::kApplication;
  { Client warm(o); }  // the logger exists from here on
  spdlog::set_level(spdlog::level::info);
  std::fflush(stdout);
  std::fflush(stderr);
  FILE* out = std::tmpfile();
  FILE* err = std::tmpfile();
  ASSERT_NE(out, nullptr);
  ASSERT_NE(err, nullptr);
  const int saved_out = ::dup(1);
  const int saved_err = ::dup(2);
  ::dup2(::fileno(out), 1);
  ::dup2(::fileno(err), 2);
  { Client c(o); }  // logs "session: client on tcp ..."
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  const std::string printed = slurp(out);
  const std::string logged = slurp(err);
  std::fclose(out);
  std::fclose(err);
  EXPECT_EQ(printed, "") << "the session wrote to stdout";
  EXPECT_NE(logged.find("session: client on tcp"), std::string::npos) << logged;
}

}  // namespace
}  // namespace rdmakit::session::test
