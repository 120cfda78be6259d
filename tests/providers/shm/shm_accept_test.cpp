// The shm listener against clients that connect and then do not (or not
// yet) send their Hello: they must not hold up the clients behind them, and
// a server polling accept() with short timeouts must not drop them.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_handshake.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/rdmakit.hpp"
#include "shm_in_process.hpp"

namespace rdmakit::shm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Connects to the listener's abstract socket and says nothing.
Fd raw_connect(uint16_t port) {
  Fd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) return Fd();
  return fd;
}

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

// A server and a client context, a CQ each, and the server's listener.
class ShmAcceptTest : public ::testing::Test {
 protected:
  std::unique_ptr<Context> server = open_shm();
  std::unique_ptr<Context> client = open_shm();
  std::unique_ptr<CompletionQueue> scq = server->create_cq();
  std::unique_ptr<CompletionQueue> ccq = client->create_cq();
  std::unique_ptr<Listener> listener = server->listen("127.0.0.1:0");
  const QpOptions sopts{.send_cq = scq.get(), .recv_cq = scq.get()};
  const QpOptions copts{.send_cq = ccq.get(), .recv_cq = ccq.get()};
};

// Before: accept() took the silent client first and waited its whole
// timeout for a Hello that never came, while the genuine one waited behind.
TEST_F(ShmAcceptTest, SilentClientDoesNotDelayAGenuineOne) {
  Fd silent = raw_connect(listener->port());
  ASSERT_TRUE(silent);
  std::unique_ptr<QueuePair> accepted;
  std::thread acceptor([&] {
    try {
      accepted = listener->accept(sopts, 4s);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  });
  std::this_thread::sleep_for(50ms);  // the silent one is taken first
  const auto t0 = Clock::now();
  const std::string hi = "genuine";
  std::unique_ptr<QueuePair> connected;
  try {
    connected = client->connect("127.0.0.1:" + std::to_string(listener->port()), copts,
                                std::as_bytes(std::span(hi.data(), hi.size())), 3s);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  const int64_t took = ms_since(t0);
  acceptor.join();
  std::printf("[ measure ] genuine connect beside a silent client: %lld ms\n",
              static_cast<long long>(took));
  ASSERT_NE(connected, nullptr);
  ASSERT_NE(accepted, nullptr);
  const auto& data = accepted->peer_private_data();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.data()), data.size()), hi);
  EXPECT_LT(took, 1000) << "a silent client delayed a genuine one";
}

// Before: a 1 ms accept() poll that took a connection whose Hello had not
// arrived yet closed it (ETIMEDOUT), and the client's Hello met a closed socket.
TEST_F(ShmAcceptTest, ShortAcceptPollsKeepAClientWhoseHelloIsLate) {
  Fd sock = raw_connect(listener->port());
  ASSERT_TRUE(sock);
  for (int i = 0; i < 20; ++i) {  // the connection is taken, its Hello is not there
    try {
      auto qp = listener->accept(sopts, 1ms);
      FAIL() << "accepted a client that sent no Hello";
    } catch (const Error& e) {
      ASSERT_EQ(e.sys_errno(), ETIMEDOUT) << e.what();
    }
  }
  // Now the Hello, by hand (what connect() sends).
  auto& cctx = dynamic_cast<ShmContext&>(*client);
  LocalEnd local = prepare_local_end(cctx, copts, false);
  ASSERT_EQ(send_handshake(sock.get(), cctx, local, copts, {}, true), 0);
  std::unique_ptr<QueuePair> accepted;
  const auto deadline = Clock::now() + 5s;
  while (!accepted && Clock::now() < deadline) {
    try {
      accepted = listener->accept(sopts, 1ms);
    } catch (const Error& e) {
      ASSERT_EQ(e.sys_errno(), ETIMEDOUT) << e.what();
    }
  }
  ASSERT_NE(accepted, nullptr);
  PeerEnd answer =
      receive_handshake(sock.get(), "connect", "listener", cred_of(sock.get()), cctx, 5s);
  EXPECT_EQ(answer.ring_size, 256u);
}

}  // namespace
}  // namespace rdmakit::shm
