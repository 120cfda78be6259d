#pragma once
// The tcp completion queue: a ring the queue pairs push into, polled by its
// owner, which also drives the attached queue pairs' progress.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cq_budget.hpp"
#include "core/fd.hpp"
#include "providers/tcp/tcp_progress.hpp"
#include "rdmakit/completion_queue.hpp"

namespace rdmakit::tcp {

class TcpQp;

// What polling a completion frees: the verbs slot rule for send queues,
// and likewise for receive queues and SRQs, so a CQ sized to the depths
// attached to it can never overrun (see TcpCq::reserve).
// kOrphan: the QP is gone; the entry still holds CQ room until polled.
enum class Retire : uint8_t { kNone, kSend, kRecv, kSrq, kOrphan };

struct CqEntry {
  Completion c;
  TcpQp* retire_qp = nullptr;  // null once the QP is gone
  uint64_t retire_seq = 0;     // kSend: the slot's sequence number
  Retire retire = Retire::kNone;
};

class TcpSrq;

class TcpCq final : public CompletionQueue {
 public:
  TcpCq(std::shared_ptr<TcpProgress> progress, const CqOptions& options);
  ~TcpCq() override;
  int poll(std::span<Completion> out) noexcept override;
  int fd() const noexcept override { return event_fd_.get(); }
  bool arm() noexcept override;

  // Producer side (any thread, under the producing QP's lock).
  void push(const CqEntry& entry) noexcept;
  // Control path: commits `depth` completions (an SRQ's max_wr once per
  // SRQ). Throws Error(EINVAL) when capacity would be exceeded, so the
  // ring can never overrun and no completion is ever dropped.
  void reserve(uint32_t depth, TcpSrq* srq, const char* op, const std::string& peer);
  void unreserve(uint32_t depth, TcpSrq* srq) noexcept;
  // True if `depth` plus an SRQ's `srq_depth` (unless already counted here)
  // still fits; checked before connecting.
  bool has_room(uint32_t depth, uint32_t srq_depth, TcpSrq* srq) noexcept;
  void attach(TcpQp* qp);
  // Stops polls from driving qp (waits for one that is).
  void detach(TcpQp* qp) noexcept;
  // Once qp can push nothing more: its entries stay pollable but no longer
  // name it, and stay charged against capacity until polled.
  void orphan(TcpQp* qp) noexcept;
  // True while an application thread is busy-polling this CQ, so the
  // progress thread keeps off its queue pairs (no contention, no thread hop).
  bool driving(int64_t now) const noexcept {
    return !armed_.load(std::memory_order_seq_cst) &&
           now - last_poll_ns_.load(std::memory_order_relaxed) < kDriveWindowNs;
  }
  bool armed() const noexcept { return armed_.load(std::memory_order_seq_cst); }
  uint64_t overflows() const noexcept { return overflows_; }
  uint32_t capacity() const noexcept { return static_cast<uint32_t>(ring_.size()); }

  // How long after its last poll an unarmed CQ still counts as driven. An
  // application thread that busy-polls between pieces of its own work (a
  // stream writer copying 1 MiB and sending it: 250-350 us between polls)
  // must keep its sockets through such a gap: with 200 us the progress
  // thread took them over in every gap, and each takeover was a wake-up, a
  // context switch and lock contention on the application's own core. A
  // thread that stops polling arms the CQ first (which ends the window at
  // once) or is taken over this much later.
  static constexpr int64_t kDriveWindowNs = 2'000'000;

 private:
  std::shared_ptr<TcpProgress> progress_;
  SpinLock ring_lock_;  // producers are the QPs' drivers, possibly several
  std::vector<CqEntry> ring_;
  uint64_t head_ = 0, tail_ = 0;
  uint64_t overflows_ = 0;
  core::Fd event_fd_;
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> last_poll_ns_{0};
  std::mutex attach_mu_;  // QP create/destroy vs poll (poll only try_locks)
  std::vector<TcpQp*> qps_;
  core::CqBudget budget_{0};                        // reserved depths (under attach_mu_)
  std::atomic<uint64_t> orphans_{0};                // destroyed QPs' unpolled entries
  std::vector<std::pair<TcpSrq*, uint32_t>> srqs_;  // SRQ -> QPs counted once
};

}  // namespace rdmakit::tcp
