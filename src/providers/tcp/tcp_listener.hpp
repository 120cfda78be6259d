#pragma once
// The tcp listener: a listening socket; accept() answers one client's
// handshake and returns its queue pair.
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/fd.hpp"
#include "providers/tcp/tcp_progress.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::tcp {

class TcpListener final : public Listener {
 public:
  TcpListener(std::shared_ptr<Engine> engine, core::Fd fd, std::string address,
              uint16_t port)
      : engine_(std::move(engine)),
        fd_(std::move(fd)),
        address_(std::move(address)),
        port_(port) {}

  std::unique_ptr<QueuePair> accept(const QpOptions& requested,
                                    std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override;
  std::string address() const override { return address_; }
  uint16_t port() const override { return port_; }

 private:
  std::shared_ptr<Engine> engine_;
  core::Fd fd_;
  std::string address_;
  uint16_t port_;
};

}  // namespace rdmakit::tcp
