#pragma once
// A server: listens on host:port, accepts peers (on a control thread of its
// own, so an accept never blocks the data path), and runs the handlers.
#include <chrono>
#include <memory>
#include <rdmakit/export.hpp>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/buffer_pool.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <rdmakit/session/options.hpp>
#include <string>

namespace rdmakit::session {

namespace detail {
class Engine;
}

class RDMAKIT_API Server {
 public:
  // Opens a context on options.provider and listens on `address` ("host:port",
  // port 0 picks one). Throws Error. Peers are accepted after start().
  Server(const std::string& address, SessionOptions options, Handlers handlers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Context& context() noexcept;
  // Exposes a buffer under `name` to every peer (before start()).
  // expose(name, size) allocates it and returns it.
  MemoryRegion& expose(const std::string& name, size_t size,
                       uint32_t access = kAccessAll);
  void expose(const std::string& name, MemoryRegion& region);
  // Exposes to each peer a buffer of its own (before start()): every accepted
  // endpoint gets a fresh zero-filled region of `size` bytes under `name`,
  // which only that peer sees in its table, and which this side reaches
  // with Endpoint::local_buffer(name) (e.g. in on_connect). It goes with the
  // endpoint. Throws Error on a bad or taken name.
  void expose_per_endpoint(const std::string& name, size_t size,
                           uint32_t access = kAccessAll);

  void start();
  uint16_t port() const noexcept;
  std::string address() const;

  // ThreadMode::kApplication: runs completions and handlers for up to
  // `timeout` (busy: one pass; blocking: sleeps while idle). Returns the
  // number of completions handled.
  int progress(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // ThreadMode::kApplication with EventMode::kEpollFd: the fd to add to the
  // application's epoll set, and the arm rule:
  //   if (server.arm()) epoll_wait(...);   // false: work is pending
  //   server.progress();                   // always after waking
  int fd() const;
  bool arm();

  size_t endpoints() const;

 private:
  std::unique_ptr<detail::Engine> engine_;
};

}  // namespace rdmakit::session
