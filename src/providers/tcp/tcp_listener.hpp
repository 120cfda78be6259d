#pragma once
// The tcp listener: a listening socket; accept() answers one client's
// handshake and returns its queue pair.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/deadline.hpp"
#include "core/fd.hpp"
#include "core/handshake_backlog.hpp"
#include "providers/tcp/tcp_progress.hpp"
#include "providers/tcp/tcp_wire.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::tcp {

// One accepted client whose handshake is still arriving. The frame is read
// into a fixed buffer (its size bounded before anything is read).
struct PendingHandshake {
  core::Fd fd;
  std::string peer;
  core::Clock::time_point deadline;
  std::array<std::byte, kHeaderSize + kHelloBodySize + Context::kMaxPrivateData> buf{};
  size_t got = 0;
};

class TcpListener final : public Listener {
 public:
  TcpListener(std::shared_ptr<TcpProgress> progress, core::Fd fd, std::string address,
              uint16_t port)
      : progress_(std::move(progress)),
        fd_(std::move(fd)),
        address_(std::move(address)),
        port_(port) {}

  // Handshakes run concurrently: every client accepted is pending until its
  // handshake has arrived (each within kHandshakeTimeout), and the first to
  // complete is answered. Silent clients therefore cost a slot of a bounded
  // backlog, not time of the clients behind them.
  std::unique_ptr<QueuePair> accept(const QpOptions& requested,
                                    std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override;
  std::string address() const override { return address_; }
  uint16_t port() const override { return port_; }

 private:
  // Takes every connection the kernel has queued into the pending set.
  void accept_queued();

  std::shared_ptr<TcpProgress> progress_;
  core::Fd fd_;
  std::string address_;
  uint16_t port_;
  std::mutex mu_;  // guards pending_ (accept() may run in several threads)
  core::HandshakeBacklog<PendingHandshake> pending_;
};

}  // namespace rdmakit::tcp
