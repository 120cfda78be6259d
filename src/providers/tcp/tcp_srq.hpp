#pragma once
// The tcp shared receive queue.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "providers/tcp/tcp_progress.hpp"
#include "rdmakit/shared_receive_queue.hpp"

namespace rdmakit::tcp {

class TcpQp;

// Shared receive queue: a FIFO ring of RECVs claimed by whichever attached
// QP's SEND/WRITE_WITH_IMM arrives first. Posters and the QPs' drivers
// (pollers, the progress thread) meet under a spin lock held for a copy.
class TcpSrq final : public SharedReceiveQueue {
 public:
  TcpSrq(std::shared_ptr<TcpProgress> progress, const SrqOptions& options);
  ~TcpSrq() override;
  const TcpProgress* progress() const noexcept { return progress_.get(); }
  // Takes the oldest posted RECV; false when none is posted.
  bool claim(RecvWr* out) noexcept;
  // A completion of a claimed RECV was polled (or its QP is gone): the
  // slot may be posted again.
  void retire_one() noexcept { retired_.fetch_add(1, std::memory_order_release); }
  void attach(TcpQp* qp);
  void detach(TcpQp* qp) noexcept;

 protected:
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  std::shared_ptr<TcpProgress> progress_;
  SpinLock lock_;
  std::vector<RecvWr> ring_;
  uint64_t head_ = 0, tail_ = 0;  // claimed, posted (under lock_)
  std::atomic<uint64_t> retired_{0};
  std::mutex attach_mu_;  // control path; post only try_locks
  std::vector<TcpQp*> qps_;
};

}  // namespace rdmakit::tcp
