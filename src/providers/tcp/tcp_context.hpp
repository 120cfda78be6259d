#pragma once
// The tcp context: region registration, CQs, SRQs, listen and connect (the
// handshake is in tcp_handshake.cpp, accept in tcp_listener.cpp).
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "providers/tcp/tcp_progress.hpp"
#include "providers/tcp/tcp_wire.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::tcp {

class TcpContext final : public Context {
 public:
  explicit TcpContext(bool progress_thread);
  std::string device_name() const override { return "tcp"; }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override;
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override;
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options = {}) override;
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& options = {}) override;
  std::unique_ptr<Listener> listen(const std::string& address) override;
  std::unique_ptr<QueuePair> connect(
      const std::string& address, const QpOptions& options,
      std::span<const std::byte> private_data = {},
      std::chrono::milliseconds timeout = std::chrono::seconds(5)) override;
  // Wraps an already connected socket (fuzzer, white-box tests). Takes fd.
  std::unique_ptr<QueuePair> adopt(int fd, const QpOptions& options,
                                   const Hello& peer_hello, std::string peer);
  const std::shared_ptr<TcpProgress>& progress() const noexcept { return progress_; }

 private:
  std::shared_ptr<TcpProgress> progress_;
};

}  // namespace rdmakit::tcp
