#pragma once
#include <atomic>
#include <mutex>
#include <vector>

#include "providers/shm/unix_socket.hpp"
#include "rdmakit/completion_queue.hpp"

namespace rdmakit::shm {

class ShmQueuePair;

// Send-side completions are produced by the owning thread into a private
// ring; receive-side completions are read straight from each attached QP's
// shared receive ring. fd() is an epoll set of an eventfd (peers and the
// service thread signal it when armed) and a timerfd (RNR retry pacing).
class ShmCompletionQueue final : public CompletionQueue {
 public:
  explicit ShmCompletionQueue(const CqOptions& options);
  ~ShmCompletionQueue() override;

  int poll(std::span<Completion> out) noexcept override;
  int fd() const noexcept override { return epoll_.get(); }
  bool arm() noexcept override;

  int wake_fd() const noexcept { return event_.get(); }

  // Control path. Throws Error(EINVAL) if the QP depths exceed capacity, so
  // the private ring can never overflow. QPs may be created and destroyed
  // from several threads at once; not while another thread polls this CQ
  // (it is single-owner, see completion_queue.hpp). Attaching a thread-safe
  // QP makes the private ring multi-producer (locked).
  void attach_send(ShmQueuePair* qp, uint32_t depth);
  void attach_recv(ShmQueuePair* qp, uint32_t depth);
  void detach(ShmQueuePair* qp) noexcept;

  // Held around push() and filling the entry: a CQ whose QPs are thread-safe
  // has several producing threads, and then the ring is locked.
  class ProducerGuard {
   public:
    explicit ProducerGuard(ShmCompletionQueue& cq) noexcept
        : cq_(cq.multi_producer_ ? &cq : nullptr) {
      if (cq_ != nullptr) cq_->lock_ring();
    }
    ~ProducerGuard() {
      if (cq_ != nullptr) cq_->ring_lock_.store(false, std::memory_order_release);
    }
    ProducerGuard(const ProducerGuard&) = delete;
    ProducerGuard& operator=(const ProducerGuard&) = delete;

   private:
    ShmCompletionQueue* cq_;
  };
  ProducerGuard producer_guard() noexcept { return ProducerGuard(*this); }

  // Data path: a send completion; polling it retires the QP's send slots
  // up to retire_to (selective signaling).
  // Filled in place: a Completion built on the stack and copied costs a
  // store-forwarding stall on this path.
  Completion& push(ShmQueuePair* qp, uint64_t retire_to) noexcept {
    Entry& e = ring_[tail_ & mask_];
    e.qp = qp;
    e.retire_to = retire_to;
    ++tail_;
    return e.completion;
  }

 private:
  struct Entry {
    Completion completion;
    ShmQueuePair* qp;
    uint64_t retire_to;
  };
  void disarm() noexcept;
  void lock_ring() noexcept;
  void reserve(uint32_t depth);

  std::vector<Entry> ring_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  uint64_t committed_ = 0;  // sum of attached depths
  std::vector<ShmQueuePair*> send_qps_;
  std::vector<ShmQueuePair*> recv_qps_;
  size_t next_recv_ = 0;  // round-robin start for fairness across QPs
  bool armed_ = false;
  bool multi_producer_ = false;  // a thread-safe QP is attached
  std::atomic<bool> ring_lock_{false};
  std::mutex attach_mu_;  // control path only: attach/detach among themselves
  Fd epoll_;
  Fd event_;
  Fd timer_;
};

}  // namespace rdmakit::shm
