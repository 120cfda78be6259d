#pragma once
// rdmakit-kv server: owns the table (a region clients READ) and answers PUT,
// GET, DEL and TABLE messages from any number of clients. One thread serves
// every client from one completion queue; another accepts connections.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "auth.hpp"
#include "protocol.hpp"
#include "rdmakit/auth.hpp"
#include "rdmakit/rdmakit.hpp"
#include "table.hpp"

namespace rdmakit::kv {

struct ServerOptions {
  // Loopback unless told otherwise: the table is readable by every client.
  std::string address = "127.0.0.1:7471";
  // Clients must prove this secret before anything is served (auth.hpp).
  // Without one the server only starts on a loopback address, or with
  // allow_no_auth (--no-auth).
  std::shared_ptr<const auth::Secret> secret;
  bool allow_no_auth = false;
  // A client that has not proved the secret by then is dropped.
  std::chrono::milliseconds auth_timeout{5000};
  ProviderKind provider = ProviderKind::kAuto;
  TableOptions table;
  bool quiet = false;          // no line per request
  uint32_t max_clients = 64;   // connections served at once
  int exit_after_clients = 0;  // > 0: return once this many clients came and went
  // Poll the completion queue without ever sleeping. On tcp the polling
  // thread then serves the clients' READs itself (no wake-up of the
  // provider's progress thread per READ), as rdmakit-perf's read_lat target
  // does; it costs a whole core.
  bool busy_poll = false;
};

class Server {
 public:
  // Opens the context and listens; throws rdmakit::Error.
  explicit Server(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const { return listener_->port(); }
  // "127.0.0.1:7471 (provider tcp, auth on: secret from file ...)".
  std::string describe() const;
  const char* provider_name() const { return ctx_->provider_name(); }
  // Serves until stop is set (or exit_after_clients is reached).
  void run(const std::atomic<bool>& stop);

  // Counters, for the log and the tests.
  uint64_t requests() const { return requests_; }
  uint64_t malformed() const { return malformed_; }
  uint64_t auth_failures() const { return auth_failures_; }

 private:
  struct Conn;
  struct Pending {
    std::unique_ptr<QueuePair> qp;
    auth::Nonce client_nonce;
    auth::Nonce server_nonce;
  };
  void accept_loop();
  void stop_acceptor();
  void adopt_pending();
  void on_completion(const Completion& c);
  void handle(Conn& conn, uint32_t slot, uint32_t byte_len);
  // The connection's first message: its proof (auth.hpp).
  void authenticate(Conn& conn, uint32_t slot, uint32_t byte_len);
  void refuse(Conn& conn, uint32_t slot, AuthStatus status, const std::string& why);
  bool post_reply(Conn& conn, uint32_t slot, size_t len);
  // Drops connections that did not authenticate (or close) in time.
  void expire_unauthenticated();
  // Logs the drop unless quiet (loud: always, for refused and silent peers).
  void drop(uint32_t id, const char* why, bool loud = false);
  std::byte* recv_slot(Conn& conn, uint32_t slot) const;
  std::byte* send_slot(Conn& conn, uint32_t slot) const;
  void publish_table_info();

  ServerOptions options_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Table> table_;
  std::unique_ptr<Listener> listener_;

  std::atomic<bool> accepting_{true};
  std::atomic<uint32_t> live_clients_{0};
  std::thread acceptor_;
  std::mutex mutex_;  // guards pending_ and info_blob_
  std::vector<Pending> pending_;
  std::vector<std::byte> info_blob_;  // the current TableInfo, sent after the proof

  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;
  uint32_t next_id_ = 1;
  int finished_clients_ = 0;
  uint64_t requests_ = 0;
  uint64_t malformed_ = 0;
  uint64_t auth_failures_ = 0;
  std::chrono::steady_clock::time_point next_expiry_{};
};

}  // namespace rdmakit::kv
