#pragma once
// The verbs context: the protection domain of one opened device, memory
// registration, CQs, SRQs, listen and connect.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_mr.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::verbs {

class VerbsContext final : public Context {
 public:
  explicit VerbsContext(std::shared_ptr<Device> device)
      : Context(ProviderKind::kVerbs), device_(std::move(device)) {}

  std::string device_name() const override { return device_->name(); }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override;
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override;
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options) override;
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& options) override;
  std::unique_ptr<Listener> listen(const std::string& address) override;
  std::unique_ptr<QueuePair> connect(const std::string& address, const QpOptions& options,
                                     std::span<const std::byte> private_data,
                                     std::chrono::milliseconds timeout) override;

 private:
  std::unique_ptr<MemoryRegion> register_mapping(void* addr, size_t length,
                                                 uint32_t access, Mapping* mapping,
                                                 size_t mapping_length);
  std::shared_ptr<Device> device_;
};

// Opens the device options name (or the first with an ACTIVE port), its
// GID and protection domain. Throws rdmakit::Error.
std::shared_ptr<Device> open_device(const ContextOptions& options);

}  // namespace rdmakit::verbs
