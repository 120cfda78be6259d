#pragma once
// Entry point: a context on one provider (the protection domain). It creates
// memory regions, completion queues, listeners and connected queue pairs.
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rdmakit/completion_queue.hpp"
#include "rdmakit/export.hpp"
#include "rdmakit/memory.hpp"
#include "rdmakit/provider.hpp"
#include "rdmakit/queue_pair.hpp"
#include "rdmakit/shared_receive_queue.hpp"

namespace rdmakit {

// Options only the verbs provider reads.
struct VerbsContextOptions {
  std::string device;  // device name (default: the first usable one)
  int gid_index = -1;  // -1: pick a RoCEv2 IPv4 GID automatically
};

// Options only the shm provider reads: processes of other users. A peer's
// uid comes from the kernel (SO_PEERCRED). By default a peer of another uid
// is refused, both by a listener and by a connecting side. An admitted one
// (listed here, or in RDMAKIT_SHM_ALLOW_UIDS=uid,name,...|any) reaches only
// regions allocated with a remote access bit, and read-only ones stay
// read-only; it never reaches memory given to register_memory().
struct ShmContextOptions {
  std::vector<uint32_t> allowed_uids;
  bool allow_any_uid = false;
};

struct ContextOptions {
  // kAuto: RDMAKIT_PROVIDER if set, else verbs when a usable device exists,
  // else shm. The choice and the reason are logged.
  ProviderKind provider = ProviderKind::kAuto;
  VerbsContextOptions verbs;
  ShmContextOptions shm;
};

class RDMAKIT_API Listener {
 public:
  virtual ~Listener() = default;
  // Waits for one connection request, answers with reply_private_data and
  // returns the connected QP. Throws Error(ETIMEDOUT) after timeout.
  virtual std::unique_ptr<QueuePair> accept(
      const QpOptions& options, std::chrono::milliseconds timeout,
      std::span<const std::byte> reply_private_data = {}) = 0;
  // host:port actually bound (port 0 resolves to the one chosen).
  virtual std::string address() const = 0;
  virtual uint16_t port() const = 0;
};

class RDMAKIT_API Context {
 public:
  static constexpr size_t kMaxPrivateData = 192;

  static std::unique_ptr<Context> open(const ContextOptions& options = {});
  virtual ~Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ProviderKind provider() const noexcept { return provider_; }
  const char* provider_name() const noexcept { return rdmakit::provider_name(provider_); }
  // Device in use (verbs: "rxe0"; shm/tcp: the provider's own name).
  virtual std::string device_name() const = 0;

  // Registers caller memory. access: Access bits.
  virtual std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                        uint32_t access) = 0;
  // Allocates provider-best memory (shm: memfd, shared with peers directly;
  // verbs: huge pages when available), zero-filled, and registers it.
  virtual std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) = 0;

  virtual std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options = {}) = 0;

  // A receive queue shared by the QPs that name it in QpOptions::srq.
  virtual std::unique_ptr<SharedReceiveQueue> create_srq(
      const SrqOptions& options = {}) = 0;

  // "host:port"; port 0 picks a free one.
  virtual std::unique_ptr<Listener> listen(const std::string& address) = 0;

  // Connects to a listener; private_data (<= kMaxPrivateData bytes) is
  // delivered to the acceptor. Throws Error (ECONNREFUSED, ETIMEDOUT, ...).
  virtual std::unique_ptr<QueuePair> connect(
      const std::string& address, const QpOptions& options,
      std::span<const std::byte> private_data = {},
      std::chrono::milliseconds timeout = std::chrono::seconds(5)) = 0;

 protected:
  explicit Context(ProviderKind provider) noexcept : provider_(provider) {}

 private:
  ProviderKind provider_;
};

}  // namespace rdmakit
