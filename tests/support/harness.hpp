#pragma once
// Two-process test harness: every conformance case runs a server role and one
// or more client roles in separate processes.
//
// Environment:
//   RDMAKIT_TEST_PROVIDERS    comma list of providers to test (default "shm")
//   RDMAKIT_TEST_ROLE         unset: fork server and clients locally;
//                             "server" / "client": run only that role, so the
//                             two roles can run as two invocations on two hosts
//   RDMAKIT_TEST_HOST         address the server listens on and the client
//                             connects to (default 127.0.0.1)
//   RDMAKIT_TEST_BASE_PORT    case i uses port base+i. Default: ephemeral ports
//                             in fork mode (announced through a pipe), and
//                             30000 + (uid % 200) * 128 in split mode
//   RDMAKIT_TEST_SERVER_NETNS fork mode: the server enters /var/run/netns/NAME
//                             before opening its context
//   RDMAKIT_TEST_TIMEOUT_SCALE multiplies the hang guards (per-completion
//                             waits, accept/connect, per-case limit) for slow
//                             emulated hosts; default 1. Timing semantics
//                             under test (RNR, peer_timeout) are not scaled.
//
// In split mode both invocations must run the same binary with the same
// RDMAKIT_TEST_PROVIDERS and base port: the case index is the test's position
// among all tests of the binary (sorted by name, independent of filters and
// shuffling). A client retries ECONNREFUSED until its server is up.
//
// In fork mode the parent only forks and reaps: contexts own threads, so they
// are created in the children after fork. A child reports its gtest failures
// through its exit status; the parent kills children that outlive the case's
// timeout and fails the test.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::test {

enum class RoleMode { kFork, kServer, kClient };

struct HarnessConfig {
  std::vector<std::string> providers;
  RoleMode mode = RoleMode::kFork;
  std::string host;
  uint16_t base_port = 0;  // 0: ephemeral ports (fork mode only)
  std::string server_netns;
  double timeout_scale = 1.0;

  // Parsed once from the environment; exits with a message on bad values.
  static const HarnessConfig& get();
};

// A hang guard multiplied by RDMAKIT_TEST_TIMEOUT_SCALE.
std::chrono::milliseconds scaled(std::chrono::milliseconds guard);

// RDMAKIT_TEST_PROVIDERS as a list, for INSTANTIATE_TEST_SUITE_P.
std::vector<std::string> providers_from_env();

// Index of the running test among all tests of the binary, sorted by name, so
// that two invocations on two hosts derive the same port for a case.
int current_case_index();

// What a role function gets: its identity and the rendezvous with the peer.
class RoleEnv {
 public:
  RoleEnv(std::string provider, bool server, int client_index, int clients, uint16_t port,
          int port_read_fd, int port_write_fd);
  ~RoleEnv();
  RoleEnv(const RoleEnv&) = delete;
  RoleEnv& operator=(const RoleEnv&) = delete;

  const std::string& provider() const { return provider_; }
  ProviderKind kind() const;
  bool is_server() const { return server_; }
  int client_index() const { return client_index_; }
  int clients() const { return clients_; }

  // Opens a context on the provider under test.
  std::unique_ptr<Context> open_context() const;

  // Server: host:port to listen on (port may be 0 = ephemeral).
  std::string listen_address() const;
  // Server: listens on listen_address() and announces the bound port.
  std::unique_ptr<Listener> listen(Context& ctx);
  // Server: announces a port to every client (fork mode; no-op when split).
  void publish_port(uint16_t port);

  // Client: the server's host:port (fork mode: waits for the announcement).
  std::string server_address();
  // Client: connects to the server. In split mode the server may not be up
  // yet, so ECONNREFUSED is retried for a bounded time.
  std::unique_ptr<QueuePair> connect(
      Context& ctx, const QpOptions& options,
      std::span<const std::byte> private_data = {},
      std::chrono::milliseconds timeout = scaled(std::chrono::seconds(10)));

 private:
  std::string provider_;
  bool server_;
  int client_index_;
  int clients_;
  uint16_t port_;
  int port_read_fd_;
  int port_write_fd_;
  std::string server_address_;  // cached after the announcement
};

struct RunOptions {
  int clients = 1;
  // Per case (times RDMAKIT_TEST_TIMEOUT_SCALE); children are killed after it.
  std::chrono::seconds timeout{30};
  // The role may SIGKILL itself (peer-death tests); that is not a failure.
  bool server_may_be_killed = false;
  bool client_may_be_killed = false;
};

using RoleFn = std::function<void(RoleEnv&)>;

// Runs the roles of one case for the given provider (see the file comment).
// Records a gtest failure for every role that failed, crashed or hung.
void run_roles(const std::string& provider, const RoleFn& server, const RoleFn& client,
               const RunOptions& options = {});

}  // namespace rdmakit::test
