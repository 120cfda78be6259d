#pragma once
#include <atomic>
#include <memory>
#include <mutex>

#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_posted_recv.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/detail/conditional_lock.hpp"
#include "rdmakit/shared_receive_queue.hpp"

namespace rdmakit::shm {

class ShmContext;

// The owner's side of a shared receive queue: an SrqBlock in a memfd that
// the senders of attached QPs map (see shm_layout.hpp).
class ShmSrq final : public SharedReceiveQueue {
 public:
  ShmSrq(ShmContext& context, const SrqOptions& options);
  ~ShmSrq() override;

  ShmContext& context() const noexcept { return context_; }
  int block_fd() const noexcept { return fd_.get(); }
  uint32_t ring_size() const noexcept { return static_cast<uint32_t>(mask_ + 1); }

  // Completion side (the thread polling the attached QPs' recv CQs).
  // A claimed-entry value (entry + 1) read from a peer-writable slot.
  bool valid_claim(uint64_t claimed) const noexcept {
    return claimed != 0 && claimed - 1 <= mask_;
  }
  // Our own record of each posted RECV: the shared entries are writable by
  // the senders, so where data goes is never read back from them.
  const PostedRecv& posted(uint32_t entry) const noexcept { return posted_[entry]; }
  // A sender's claim of entry, read from a slot it can write, names a RECV
  // that is posted and was taken from the ring (claimed by some sender):
  // a forged claim of an unclaimed RECV, or of one already completed, is
  // refused instead of completing a RECV twice.
  bool claim_is_live(uint32_t entry) const noexcept {
    return busy_[entry].load(std::memory_order_acquire) != 0 &&
           position_[entry] < block_->claimed.load(std::memory_order_acquire);
  }
  // The completion of entry was delivered (or its QP is gone): it may hold a
  // new RECV. Counted once, whatever a peer wrote.
  void release(uint32_t entry) noexcept {
    if (busy_[entry].exchange(0, std::memory_order_acq_rel) != 0) {
      released_.fetch_add(1, std::memory_order_release);
    }
  }

 protected:
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  ShmContext& context_;
  Fd fd_;
  SrqBlock* block_ = nullptr;
  size_t block_bytes_ = 0;
  uint32_t mask_ = 0;
  std::unique_ptr<PostedRecv[]> posted_;          // by entry
  std::unique_ptr<std::atomic<uint8_t>[]> busy_;  // by entry
  std::unique_ptr<uint64_t[]> position_;          // by entry: its ring position
  uint32_t next_entry_ = 0;  // where the search for a free entry starts
  uint64_t posted_count_ = 0;
  std::atomic<uint64_t> released_{0};
  std::mutex post_mutex_;  // only when options.thread_safe
};

}  // namespace rdmakit::shm
