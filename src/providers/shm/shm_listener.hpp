#pragma once
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "core/deadline.hpp"
#include "core/handshake_backlog.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::shm {

class ShmContext;

// How long a connected client may take to send its Hello (it sends it right
// after connect); core::kMaxPendingHandshakes such clients may wait at once,
// and one more drops the oldest.
inline constexpr std::chrono::milliseconds kHandshakeTimeout{5000};

// Listens on the abstract Unix socket "rdmakit-shm:<port>": shm peers meet
// by port on the same host (the host part is only checked for syntax).
class ShmListener final : public Listener {
 public:
  ShmListener(ShmContext& context, const std::string& address);
  // Clients whose Hello has not arrived stay pending across calls (each for
  // kHandshakeTimeout); the first whose Hello arrives is answered. A client
  // that connects and says nothing costs a slot, not the time of the
  // clients behind it, and a caller polling with short timeouts never drops
  // a client whose Hello is on its way.
  std::unique_ptr<QueuePair> accept(
      const QpOptions& options, std::chrono::milliseconds timeout,
      std::span<const std::byte> reply_private_data) override;
  std::string address() const override { return host_ + ":" + std::to_string(port_); }
  uint16_t port() const override { return port_; }

 private:
  struct Pending {
    Fd conn;
    std::string peer;
    PeerCred cred;
    core::Clock::time_point deadline;
  };
  // Takes every connection the kernel has queued into pending_.
  void accept_queued();

  ShmContext& context_;
  std::string host_;
  uint16_t port_ = 0;
  Fd socket_;
  std::mutex mu_;  // guards pending_ (accept() may run in several threads)
  core::HandshakeBacklog<Pending> pending_;
  uint64_t refused_ = 0;  // connections of users we do not admit
};

}  // namespace rdmakit::shm
