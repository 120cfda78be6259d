#pragma once
// A client: connects to a server (retrying a refused connection or a cut
// handshake with backoff for up to connect_timeout) and yields one endpoint.
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

class RDMAKIT_API Client {
 public:
  // Opens a context on options.provider. Nothing is connected yet.
  explicit Client(SessionOptions options, Handlers handlers = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Context& context() noexcept;
  MemoryRegion& expose(const std::string& name, size_t size,
                       uint32_t access = kAccessAll);
  void expose(const std::string& name, MemoryRegion& region);

  // Connects every channel of options.channels and waits until the peer's
  // buffer table arrived. Throws Error naming the address, provider and cause
  // (refused or cut after the retries, timeout, handshake rejected).
  Endpoint& connect(const std::string& address);
  Endpoint& endpoint() const;

  // As Server::progress / fd / arm (ThreadMode::kApplication).
  int progress(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  int fd() const;
  bool arm();

 private:
  Endpoint& connect_once(const std::string& address,
                         std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<detail::Engine> engine_;
  std::shared_ptr<Endpoint> endpoint_;
};

}  // namespace rdmakit::session
