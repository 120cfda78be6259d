#pragma once
// Registered memory and the descriptor a peer needs to reach it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "rdmakit/export.hpp"
#include "rdmakit/provider.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit {

// What a peer needs to WRITE/READ/atomically access a region: address in the
// owner's address space, length and remote key. Serializes to a fixed-size,
// versioned, little-endian blob for exchange in private data or messages.
struct RDMAKIT_API RemoteRegion {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  uint32_t access = 0;  // Access bits granted
  ProviderKind provider = ProviderKind::kAuto;

  static constexpr size_t kSerializedSize = 32;
  static constexpr uint8_t kVersion = 1;

  // Writes kSerializedSize bytes.
  void serialize(std::span<std::byte, kSerializedSize> out) const noexcept;
  std::vector<std::byte> serialize() const;
  // nullopt if the blob is short, has a wrong magic or an unknown version.
  static std::optional<RemoteRegion> deserialize(std::span<const std::byte> in) noexcept;

  uint64_t addr_at(uint64_t offset) const noexcept { return addr + offset; }
  friend bool operator==(const RemoteRegion&, const RemoteRegion&) = default;
};

// A registered region. Destroying it deregisters: later remote accesses with
// its rkey complete with REMOTE_ACCESS_ERROR.
class RDMAKIT_API MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const noexcept { return addr_; }
  std::byte* data() const noexcept { return static_cast<std::byte*>(addr_); }
  size_t length() const noexcept { return length_; }
  uint32_t lkey() const noexcept { return lkey_; }
  uint32_t rkey() const noexcept { return rkey_; }
  uint32_t access() const noexcept { return access_; }
  ProviderKind provider() const noexcept { return provider_; }

  RemoteRegion remote() const noexcept {
    return RemoteRegion{reinterpret_cast<uint64_t>(addr_), length_, rkey_, access_,
                        provider_};
  }

 protected:
  MemoryRegion(void* addr, size_t length, uint32_t lkey, uint32_t rkey, uint32_t access,
               ProviderKind provider) noexcept
      : addr_(addr),
        length_(length),
        lkey_(lkey),
        rkey_(rkey),
        access_(access),
        provider_(provider) {}

 private:
  void* addr_;
  size_t length_;
  uint32_t lkey_;
  uint32_t rkey_;
  uint32_t access_;
  ProviderKind provider_;
};

}  // namespace rdmakit
