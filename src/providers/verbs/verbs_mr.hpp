#pragma once
// Memory regions of the verbs provider: ibv_reg_mr'ed, counted against
// RLIMIT_MEMLOCK (the kernel pins them), and the mapping allocate() made.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "providers/verbs/verbs_device.hpp"
#include "rdmakit/memory.hpp"

namespace rdmakit::verbs {

// A region registered with the device; destroying it deregisters.
class VerbsMr final : public MemoryRegion {
 public:
  VerbsMr(std::shared_ptr<Device> device, MrHandle mr, uint32_t access, void* mapping,
          size_t mapping_length);
  ~VerbsMr() override;

 private:
  std::shared_ptr<Device> device_;
  MrHandle mr_;
  void* mapping_;  // our own mmap (allocate), or null for caller memory
  size_t mapping_length_;
};

// An mmap that unmaps unless released (allocate: until registered).
class Mapping {
 public:
  Mapping(void* addr, size_t length) : addr_(addr), length_(length) {}
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, length_);
  }
  void* release() { return std::exchange(addr_, nullptr); }

 private:
  void* addr_;
  size_t length_;
};

int ibv_access(uint32_t access);

}  // namespace rdmakit::verbs
