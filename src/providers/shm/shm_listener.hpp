#pragma once
#include <string>

#include "providers/shm/unix_socket.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::shm {

class ShmContext;

// Listens on the abstract Unix socket "rdmakit-shm:<port>": shm peers meet
// by port on the same host (the host part is only checked for syntax).
class ShmListener final : public Listener {
 public:
  ShmListener(ShmContext& context, const std::string& address);
  std::unique_ptr<QueuePair> accept(
      const QpOptions& options, std::chrono::milliseconds timeout,
      std::span<const std::byte> reply_private_data) override;
  std::string address() const override { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const override { return port_; }

 private:
  ShmContext& context_;
  std::string host_;
  uint16_t port_ = 0;
  Fd socket_;
};

}  // namespace rdmakit::shm
