#pragma once
// Shared receive queue: one ibv_srq whose RECVs any attached QP may consume.
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "providers/verbs/verbs_qp.hpp"
#include "rdmakit/detail/conditional_lock.hpp"
#include "rdmakit/shared_receive_queue.hpp"

namespace rdmakit::verbs {

// Receive bookkeeping of one SRQ, shared by its poster and the CQs of every
// attached QP (pollers, possibly in other threads). RECVs of an SRQ are not
// retired in posting order (each QP's completions go to its own recv_cq), so
// the caller's wr_id waits in a slot table instead of a ring, and the
// device's wr_id is kRecvBit | kSrqBit | the slot's address: a completion
// finds its slot without the QP, even when that QP was destroyed while its
// completion was still queued. CQs hold the core so that stays valid.
struct SrqCore {
  static constexpr uint64_t kSrqBit = 1ull << 62;
  static constexpr uint64_t kTagBits = QpCore::kRecvBit | kSrqBit;

  struct Slot {
    uint64_t wr_id = 0;             // the caller's, written before busy
    std::atomic<bool> busy{false};  // poster sets (release), poller clears
    SrqCore* owner = nullptr;
  };

  explicit SrqCore(uint32_t capacity);

  static bool is_srq_recv(uint64_t device_wr_id) noexcept {
    return (device_wr_id & kTagBits) == kTagBits;
  }
  // Poller side: the caller's wr_id of a completed SRQ receive; frees its slot.
  static uint64_t complete(uint64_t device_wr_id) noexcept;

  const uint32_t capacity;
  std::unique_ptr<Slot[]> slots;
  // Poster only.
  uint64_t posted = 0;
  uint32_t cursor = 0;
  // Pollers -> poster: completed receives (slots free again).
  alignas(64) std::atomic<uint64_t> retired{0};
};

class VerbsSrq final : public SharedReceiveQueue {
 public:
  VerbsSrq(std::shared_ptr<Device> device, const SrqOptions& options);
  ~VerbsSrq() override;

  ibv_srq* srq() const noexcept { return srq_.get(); }
  const Device& device() const noexcept { return *device_; }
  const std::shared_ptr<SrqCore>& core() const noexcept { return core_; }

 protected:
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  PostResult post_locked(std::span<const RecvWr> wrs) noexcept;

  std::shared_ptr<Device> device_;
  SrqHandle srq_;
  std::shared_ptr<SrqCore> core_;
  std::mutex post_mutex_;  // only when options().thread_safe
  // Preallocated postlist: one ibv_post_srq_recv per post_recv, no allocation.
  std::vector<ibv_recv_wr> wrs_;
  std::vector<ibv_sge> sges_;
};

}  // namespace rdmakit::verbs
