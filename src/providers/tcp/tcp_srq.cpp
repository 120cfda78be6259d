#include "providers/tcp/tcp_srq.hpp"

#include <algorithm>

#include "core/log.hpp"
#include "providers/tcp/tcp_qp.hpp"

namespace rdmakit::tcp {

TcpSrq::TcpSrq(std::shared_ptr<TcpProgress> progress, const SrqOptions& options)
    : SharedReceiveQueue(options),
      progress_(std::move(progress)),
      ring_(options.max_wr) {}

TcpSrq::~TcpSrq() {
  std::lock_guard lock(attach_mu_);
  if (!qps_.empty()) {
    core::log().error("tcp: shared receive queue destroyed before {} queue pair(s)",
                      qps_.size());
  }
}

void TcpSrq::attach(TcpQp* qp) {
  std::lock_guard lock(attach_mu_);
  qps_.push_back(qp);
}

void TcpSrq::detach(TcpQp* qp) noexcept {
  std::lock_guard lock(attach_mu_);
  std::erase(qps_, qp);
}

bool TcpSrq::claim(RecvWr* out) noexcept {
  std::lock_guard lock(lock_);
  const bool any = head_ != tail_;
  if (any) *out = ring_[head_++ % ring_.size()];
  return any;
}

PostResult TcpSrq::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  PostResult result;
  {
    std::lock_guard lock(lock_);
    for (const RecvWr& wr : wrs) {
      // A slot is free once the completion of the RECV it held was polled.
      if (tail_ - retired_.load(std::memory_order_acquire) >= ring_.size()) {
        result.status = PostStatus::kQueueFull;
        break;
      }
      ring_[tail_++ % ring_.size()] = wr;
      ++result.posted;
    }
  }
  if (result.posted == 0) return result;
  // A SEND may be RNR-stalled on some QP waiting for exactly this buffer:
  // drive it now if nobody else is, and wake the progress thread in case.
  bool kick = false;
  if (std::unique_lock attach(attach_mu_, std::try_to_lock); attach) {
    const int64_t now = now_ns();
    for (TcpQp* qp : qps_) {
      if (qp->rnr_stalled() && !qp->try_progress(now)) kick = true;
    }
  } else {
    kick = true;
  }
  if (kick) progress_->kick();
  return result;
}

}  // namespace rdmakit::tcp
