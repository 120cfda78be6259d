#pragma once
// The session's machinery: the Engine (context, exposed buffers, workers,
// the acceptor); the Worker is in worker.hpp.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <rdmakit/session/options.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "wire.hpp"
#include "worker.hpp"

namespace rdmakit::session::detail {

class Engine {
 public:
  Engine(SessionOptions options, Handlers handlers, bool server);
  ~Engine();

  Context& ctx() noexcept { return *ctx_; }
  const SessionOptions& options() const noexcept { return options_; }
  const Handlers& handlers() const noexcept { return handlers_; }
  bool is_server() const noexcept { return server_; }

  MemoryRegion& expose(const std::string& name, size_t size, uint32_t access);
  void expose(const std::string& name, MemoryRegion& region);
  void expose_per_endpoint(const std::string& name, size_t size, uint32_t access);
  Table table_for(const Endpoint& ep) const;

  QpOptions qp_options(CompletionQueue* cq) const;
  std::string listen_host() const;
  // The worker a new endpoint goes to (kPollerPerEndpoint: a new one).
  Worker& next_worker();
  Worker& app_worker();  // kApplication
  // Joins and drops the per-endpoint workers whose endpoint is gone.
  void sweep_retired();

  // Server side.
  void listen(const std::string& address);
  void start_accepting();
  uint16_t port() const;
  std::string address() const;
  size_t endpoints() const;

  // Builds the channels' memory and posts nothing; used by both sides.
  std::shared_ptr<Endpoint> make_endpoint(uint64_t id, const std::string& peer,
                                          const std::vector<std::string>& names);
  void stop_all();

 private:
  void check_exposable(const std::string& name) const;
  void accept_loop();
  void accept_one(std::chrono::milliseconds timeout);

  SessionOptions options_;
  Handlers handlers_;
  bool server_;
  std::unique_ptr<Context> ctx_;
  std::vector<std::unique_ptr<MemoryRegion>> owned_;
  std::vector<std::pair<std::string, MemoryRegion*>> exposed_;
  struct PerEndpoint {
    std::string name;
    size_t size;
    uint32_t access;
  };
  std::vector<PerEndpoint> per_endpoint_;  // allocated in make_endpoint

  mutable std::mutex workers_mu_;
  std::vector<std::unique_ptr<Worker>> workers_;
  size_t next_worker_ = 0;
  Worker* staged_ = nullptr;  // per-endpoint mode: the next endpoint's worker

  // Every endpoint made, so that at shutdown the memory of those the
  // application still holds is released before the context goes.
  std::mutex made_mu_;
  std::vector<std::weak_ptr<Endpoint>> made_;

  std::unique_ptr<Listener> listener_;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
};

uint64_t random_id();

}  // namespace rdmakit::session::detail
