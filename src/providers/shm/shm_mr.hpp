#pragma once
#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/memory.hpp"

namespace rdmakit::shm {

class ShmContext;

class ShmMr final : public MemoryRegion {
 public:
  // memfd may be empty (registered user memory, or memory no peer may
  // reach, whose memfd closed once mapped); mapped_length != 0: the region
  // owns that mapping.
  ShmMr(ShmContext& context, void* addr, size_t length, uint32_t key, uint32_t access,
        Fd memfd, size_t mapped_length);
  ~ShmMr() override;

  RegionKind kind() const noexcept {
    return memfd_ ? RegionKind::kMemfd : RegionKind::kUser;
  }
  int memfd() const noexcept { return memfd_.get(); }
  // Peers get a read-only descriptor unless the region grants remote writes
  // or atomics, so the kernel enforces read-only grants.
  bool peers_may_write() const noexcept {
    return (access() & (kAccessRemoteWrite | kAccessRemoteAtomic)) != 0;
  }

 private:
  ShmContext& context_;
  Fd memfd_;
  size_t mapped_length_;
};

}  // namespace rdmakit::shm
