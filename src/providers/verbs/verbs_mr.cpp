#include "providers/verbs/verbs_mr.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include "providers/verbs/verbs_device.hpp"

namespace rdmakit::verbs {

// ---------------------------------------------------------------- memory

int ibv_access(uint32_t access) {
  int flags = 0;
  if (access & kAccessLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kAccessRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kAccessRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  if (access & kAccessRemoteAtomic) flags |= IBV_ACCESS_REMOTE_ATOMIC;
  // Verbs insists: a region the peer may write must be locally writable.
  if (flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
    flags |= IBV_ACCESS_LOCAL_WRITE;
  return flags;
}

VerbsMr::VerbsMr(std::shared_ptr<Device> device, MrHandle mr, uint32_t access,
                 void* mapping, size_t mapping_length)
    : MemoryRegion(mr->addr, mr->length, mr->lkey, mr->rkey, access,
                   ProviderKind::kVerbs),
      device_(std::move(device)),
      mr_(std::move(mr)),
      mapping_(mapping),
      mapping_length_(mapping_length) {
  process_pinned_pages() += pinned_pages(reinterpret_cast<uint64_t>(addr()), length(),
                                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
}

VerbsMr::~VerbsMr() {
  mr_.reset();
  process_pinned_pages() -= pinned_pages(reinterpret_cast<uint64_t>(addr()), length(),
                                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
  if (mapping_ != nullptr) munmap(mapping_, mapping_length_);
}

}  // namespace rdmakit::verbs
