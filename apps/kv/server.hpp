#pragma once
// rdmakit-kv server: owns the table (a region clients READ) and answers PUT,
// GET, DEL and TABLE messages from any number of clients. One thread serves
// every client from one completion queue; another accepts connections.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "protocol.hpp"
#include "rdmakit/rdmakit.hpp"
#include "table.hpp"

namespace rdmakit::kv {

struct ServerOptions {
  std::string address = "0.0.0.0:7471";
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
  const char* provider_name() const { return ctx_->provider_name(); }
  // Serves until stop is set (or exit_after_clients is reached).
  void run(const std::atomic<bool>& stop);

  // Counters, for the log and the tests.
  uint64_t requests() const { return requests_; }
  uint64_t malformed() const { return malformed_; }

 private:
  struct Conn;
  void accept_loop();
  void stop_acceptor();
  void adopt_pending();
  void on_completion(const Completion& c);
  void handle(Conn& conn, uint32_t slot, uint32_t byte_len);
  void drop(uint32_t id, const char* why);
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
  std::vector<std::unique_ptr<QueuePair>> pending_;
  std::vector<std::byte> info_blob_;  // the accept reply: the current TableInfo

  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;
  uint32_t next_id_ = 1;
  int finished_clients_ = 0;
  uint64_t requests_ = 0;
  uint64_t malformed_ = 0;
};

}  // namespace rdmakit::kv
