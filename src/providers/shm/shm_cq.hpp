#pragma once
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cq_budget.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/completion_queue.hpp"

namespace rdmakit::shm {

class ShmQp;

// Send-side completions are produced by the owning thread into a private
// ring; receive-side completions are read straight from each attached QP's
// shared receive ring. fd() is an epoll set of an eventfd (peers and the
// progress thread signal it when armed) and a timerfd (RNR retry pacing).
class ShmCq final : public CompletionQueue {
 public:
  explicit ShmCq(const CqOptions& options);
  ~ShmCq() override;

  int poll(std::span<Completion> out) noexcept override;
  int fd() const noexcept override { return epoll_.get(); }
  bool arm() noexcept override;

  int wake_fd() const noexcept { return event_->get(); }
  // The same eventfd, kept open by each holder: a QP's link wakes this CQ's
  // sleepers when its peer dies, even while the CQ is being destroyed.
  std::shared_ptr<const Fd> shared_wake() const noexcept { return event_; }
  // What a peer of another user gets to wake us: the sending end of a
  // datagram socket (its readable end is in fd()'s set). Never our eventfd,
  // whose file status flags and counter a holder controls: a peer could make
  // our reads or writes of it block. Peers send with MSG_DONTWAIT.
  int peer_wake_socket() const noexcept { return wake_tx_.get(); }

  // A producer on another thread than the owner (a thread-safe or
  // caller-serialized QP) pushed a completion or queued work: an owner asleep
  // in arm()'s wake-up must hear of it. The ring lock (or the caller's lock)
  // orders this load after the owner's arm(), whose re-check runs under the
  // same lock, so no completion is missed.
  void wake_if_armed() noexcept;
  // The same after queueing RNR work outside the ring lock: the owner's
  // arm() must set the retry timer.
  void wake_if_armed_after_queueing() noexcept;

  // Control path. Throws Error(EINVAL) if the QP depths exceed capacity, so
  // the private ring can never overflow. QPs may be created and destroyed
  // from any thread, also while the owner polls: attach and detach close the
  // owner gate (below) around their changes. Attaching a thread-safe QP
  // makes the private ring multi-producer (locked). A caller-serialized QP
  // does not: its caller's lock already orders its pushes with the owner's
  // polls and with every other producer on this CQ.
  void attach_send(ShmQp* qp, uint32_t depth);
  void attach_recv(ShmQp* qp, uint32_t depth);
  void detach(ShmQp* qp) noexcept;

  // Held around push() and filling the entry. A CQ whose QPs are thread-safe
  // has several producing threads, and then the ring is locked. Otherwise the
  // owner is the only producer and pushes inside an owner section, so that
  // attaching the first thread-safe QP (which makes the ring locked) cannot
  // overlap an unlocked push.
  class ProducerGuard {
   public:
    explicit ProducerGuard(ShmCq& cq) noexcept : cq_(cq) {
      for (;;) {
        if (cq.multi_producer_.load(std::memory_order_acquire)) {
          cq.lock_ring();
          locked_ = true;
          return;
        }
        if (cq.enter_owner()) {
          // Inside, the flag cannot change: attach() closes the gate first.
          if (!cq.multi_producer_.load(std::memory_order_relaxed)) return;
          cq.leave_owner();
          continue;
        }
        cq.wait_gate_open();
      }
    }
    ~ProducerGuard() {
      if (locked_) {
        cq_.ring_lock_.store(false, std::memory_order_release);
      } else {
        cq_.leave_owner();
      }
    }
    ProducerGuard(const ProducerGuard&) = delete;
    ProducerGuard& operator=(const ProducerGuard&) = delete;

   private:
    ShmCq& cq_;
    bool locked_ = false;

   public:
    bool locked() const noexcept { return locked_; }
  };
  ProducerGuard producer_guard() noexcept { return ProducerGuard(*this); }

  // Data path: a send completion; polling it retires the QP's send slots
  // up to retire_to (selective signaling).
  // Filled in place: a Completion built on the stack and copied costs a
  // store-forwarding stall on this path.
  Completion& push(ShmQp* qp, uint64_t retire_to) noexcept {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    Entry& e = ring_[tail & mask_];
    e.qp = qp;
    e.retire_to = retire_to;
    tail_.store(tail + 1, std::memory_order_relaxed);
    return e.completion;
  }

 private:
  struct Entry {
    Completion completion;
    ShmQp* qp;
    uint64_t retire_to;
  };
  void attach(ShmQp* qp, uint32_t depth, bool send);
  void disarm() noexcept;
  void lock_ring() noexcept;
  void reserve(uint32_t depth);

  // The owner gate. poll(), arm() and the owner's unlocked pushes run inside
  // an owner section; attach and detach (any thread) close the gate, wait
  // until the owner is outside, change the QP lists and open it again. A
  // poll() that finds the gate closed does nothing (0), an arm() waits for
  // it to open and returns false (poll again); a push waits for it to open. The owner
  // pays two plain stores and a load per outermost section: the store-load order both
  // sides need (Dekker) is a membarrier() on the rare, control-path side
  // (shm_asymmetric_fence.hpp), or sequentially consistent operations on both where that
  // is unavailable or invisible (TSan). Sections nest; only the outermost pays.
  bool enter_owner() noexcept {
    if (owner_depth_ != 0) {
      ++owner_depth_;
      return true;
    }
    const uint64_t epoch = owner_epoch_.load(std::memory_order_relaxed) + 1;
    bool closed;
    if (strong_gate_) {
      owner_epoch_.store(epoch, std::memory_order_seq_cst);
      closed = gate_closed_.load(std::memory_order_seq_cst);
    } else {
      // close_gate()'s heavy_fence() orders this store before the load.
      owner_epoch_.store(epoch, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);
      closed = gate_closed_.load(std::memory_order_acquire);
    }
    if (closed) {
      owner_epoch_.store(epoch + 1, std::memory_order_release);
      return false;
    }
    owner_depth_ = 1;
    return true;
  }
  void leave_owner() noexcept {
    if (--owner_depth_ == 0) {
      owner_epoch_.store(owner_epoch_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_release);
    }
  }
  void wait_gate_open() const noexcept;
  class OwnerSection {
   public:
    explicit OwnerSection(ShmCq& cq) noexcept : cq_(cq), entered_(cq.enter_owner()) {}
    ~OwnerSection() {
      if (entered_) cq_.leave_owner();
    }
    OwnerSection(const OwnerSection&) = delete;
    OwnerSection& operator=(const OwnerSection&) = delete;
    bool entered() const noexcept { return entered_; }

   private:
    ShmCq& cq_;
    bool entered_;
  };
  void close_gate() noexcept;
  void open_gate() noexcept { gate_closed_.store(false, std::memory_order_release); }

  struct FreeRing {
    void operator()(Entry* p) const noexcept { std::free(p); }
  };
  // calloc'ed, not a vector: a CQ sized for a thousand streams is megabytes,
  // and value-initializing them faulted in every page at creation (~5 ms on
  // a process's first connection); zero pages fault in as the ring is used.
  std::unique_ptr<Entry[], FreeRing> ring_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0;
  // Written under the producer guard; atomic so that poll() can see an empty
  // ring without taking the ring lock (entries are read under it).
  std::atomic<uint64_t> tail_{0};
  core::CqBudget budget_{0};  // sum of attached depths
  std::vector<ShmQp*> send_qps_;
  std::vector<ShmQp*> recv_qps_;
  size_t next_recv_ = 0;  // round-robin start for fairness across QPs
  size_t next_send_ = 0;  // where the next slice of send-side checks starts
  // Past kScanAll QPs a poll does not visit every QP (each costs a few cache
  // lines; 1,000 idle streams made every poll ~10 us): it visits the hot
  // ones (a completion in the last kHotPolls polls) and a slice of
  // kColdSlice others in turn, so every QP is still seen every
  // size / kColdSlice polls. The first poll after the CQ was armed (the
  // owner slept: anything may have arrived), or after an arm() that found
  // work pending, visits all.
  static constexpr size_t kScanAll = 16;
  static constexpr size_t kColdSlice = 4;
  static constexpr uint64_t kHotPolls = 4096;
  std::vector<ShmQp*> hot_;  // capacity: recv_qps_'s, reserved at attach
  uint64_t polls_ = 0;
  bool visit_all_next_ = false;  // arm() found work pending: the next poll visits all
  void note_hit(ShmQp* qp) noexcept;
  // The owner writes it; producers on other threads read it after pushing
  // under the ring lock, which orders both sides (see wake_if_armed()).
  std::atomic<bool> armed_{false};
  std::atomic<bool> multi_producer_{false};  // a thread-safe QP is attached
  std::atomic<bool> ring_lock_{false};
  std::mutex attach_mu_;  // control path only: attach/detach among themselves
  std::atomic<uint64_t> owner_epoch_{0};  // odd while the owner is in a section
  int owner_depth_ = 0;                   // the owner's section nesting
  std::atomic<bool> gate_closed_{false};
  const bool strong_gate_;  // no asymmetric fence: seq_cst on both sides
  Fd epoll_;
  std::shared_ptr<const Fd> event_;
  Fd timer_;
  Fd wake_rx_, wake_tx_;  // see peer_wake_socket()
};

}  // namespace rdmakit::shm
