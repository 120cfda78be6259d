#include "providers/shm/shm_srq.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>

#include "rdmakit/error.hpp"

namespace rdmakit::shm {

ShmSrq::ShmSrq(ShmContext& context, const SrqOptions& options)
    : SharedReceiveQueue(options), context_(context) {
  if (options.max_wr == 0 || options.max_wr > (1u << 20)) {
    throw Error("create_srq", "shm", "", EINVAL, "max_wr must be in 1..1048576");
  }
  const uint32_t ring = std::bit_ceil(2 * options.max_wr);
  mask_ = ring - 1;
  block_bytes_ = SrqBlock::bytes_for(ring);
  fd_ = create_sealed_memfd("rdmakit-shm-srq", block_bytes_);
  if (!fd_) throw Error("create_srq", "shm", "", errno, "memfd_create");
  void* mem = map_fd(fd_.get(), block_bytes_, true);
  if (mem == nullptr) throw Error("create_srq", "shm", "", errno, "mmap");
  block_ = new (mem) SrqBlock();
  block_->ring_size = ring;
  for (uint32_t i = 0; i < ring; ++i) {
    new (&block_->ring()[i]) SrqRingSlot();
    new (&block_->entries()[i]) SrqEntry();
  }
  posted_ = std::make_unique<PostedRecv[]>(ring);
  busy_ = std::make_unique<std::atomic<uint8_t>[]>(ring);
  position_ = std::make_unique<uint64_t[]>(ring);
  for (uint32_t i = 0; i < ring; ++i) busy_[i].store(0, std::memory_order_relaxed);
}

ShmSrq::~ShmSrq() { ::munmap(block_, block_bytes_); }

PostResult ShmSrq::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  PostResult result;
  for (const RecvWr& wr : wrs) {
    if (posted_count_ - released_.load(std::memory_order_acquire) >= options_.max_wr) {
      result.status = PostStatus::kQueueFull;
      break;
    }
    // At most max_wr of the 2 * max_wr entries are busy, so this ends within
    // a few steps. The ring slot is free: fewer than ring_size RECVs are
    // posted and unclaimed.
    uint32_t entry = next_entry_;
    while (busy_[entry].load(std::memory_order_acquire) != 0) entry = (entry + 1) & mask_;
    next_entry_ = (entry + 1) & mask_;
    SrqEntry& e = block_->entries()[entry];
    e.addr = reinterpret_cast<uint64_t>(wr.addr);
    e.length = wr.length;
    e.lkey = wr.lkey;
    posted_[entry] = {wr.wr_id, static_cast<std::byte*>(wr.addr), wr.length};
    position_[entry] = posted_count_;
    busy_[entry].store(1, std::memory_order_relaxed);
    SrqRingSlot& slot = block_->ring()[posted_count_ & mask_];
    slot.entry.store(entry, std::memory_order_relaxed);
    ++posted_count_;
    slot.post_seq.store(posted_count_, std::memory_order_release);
    ++result.posted;
  }
  return result;
}

}  // namespace rdmakit::shm
