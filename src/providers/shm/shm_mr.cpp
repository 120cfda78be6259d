#include "providers/shm/shm_mr.hpp"

#include <sys/mman.h>

#include "providers/shm/shm_context.hpp"

namespace rdmakit::shm {

ShmMr::ShmMr(ShmContext& context, void* addr, size_t length, uint32_t key,
             uint32_t access, Fd memfd, size_t mapped_length)
    : MemoryRegion(addr, length, key, key, access, ProviderKind::kShm),
      context_(context),
      memfd_(std::move(memfd)),
      mapped_length_(mapped_length) {}

ShmMr::~ShmMr() {
  context_.remove_region(rkey());
  if (mapped_length_ != 0) ::munmap(addr(), mapped_length_);
}

}  // namespace rdmakit::shm
