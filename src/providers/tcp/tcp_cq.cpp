#include "providers/tcp/tcp_cq.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/log.hpp"
#include "providers/tcp/tcp_qp.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

TcpCq::TcpCq(std::shared_ptr<TcpProgress> progress, const CqOptions& options)
    : CompletionQueue(options),
      progress_(std::move(progress)),
      ring_(std::max<uint32_t>(options.capacity, 1)) {
  budget_ = core::CqBudget(ring_.size());
  event_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event_fd_.get()) throw Error("create_cq", "tcp", "", errno, "eventfd");
}

TcpCq::~TcpCq() {
  std::lock_guard lock(attach_mu_);
  if (!qps_.empty()) {
    core::log().error("tcp: completion queue destroyed before {} queue pair(s)",
                      qps_.size());
  }
  event_fd_.reset();
}

bool TcpCq::has_room(uint32_t depth, uint32_t srq_depth, TcpSrq* srq) noexcept {
  std::lock_guard lock(attach_mu_);
  uint64_t need = uint64_t{depth} + srq_depth;
  for (const auto& entry : srqs_) {
    if (srq != nullptr && entry.first == srq) need -= srq_depth;  // counted once per SRQ
  }
  return budget_.committed() + orphans_.load(std::memory_order_relaxed) + need <=
         budget_.capacity();
}

void TcpCq::reserve(uint32_t depth, TcpSrq* srq, const char* op,
                    const std::string& peer) {
  std::lock_guard lock(attach_mu_);
  if (srq != nullptr) {
    for (auto& [s, n] : srqs_) {
      if (s == srq) {
        ++n;
        return;
      }
    }
  }
  // A destroyed QP's unpolled completions still occupy the ring.
  const uint64_t orphans = orphans_.load(std::memory_order_relaxed);
  budget_.charge(depth, op, "tcp", peer, orphans);
  if (srq != nullptr) srqs_.emplace_back(srq, 1);
}

void TcpCq::unreserve(uint32_t depth, TcpSrq* srq) noexcept {
  std::lock_guard lock(attach_mu_);
  if (srq != nullptr) {
    auto it = std::find_if(srqs_.begin(), srqs_.end(),
                           [&](const auto& e) { return e.first == srq; });
    if (it == srqs_.end() || --it->second != 0) return;
    srqs_.erase(it);
  }
  budget_.refund(depth);
}

void TcpCq::attach(TcpQp* qp) {
  std::lock_guard lock(attach_mu_);
  qps_.push_back(qp);
}

void TcpCq::detach(TcpQp* qp) noexcept {
  // poll() drives its QPs with attach_mu_ held: once we have it, no poll of
  // this CQ is inside qp and none will enter it.
  std::lock_guard lock(attach_mu_);
  std::erase(qps_, qp);
}

void TcpCq::orphan(TcpQp* qp) noexcept {
  // Completions of a destroyed QP stay pollable, minus slot accounting. The
  // SRQ may be destroyed before they are polled, so its slots are returned
  // now; the CQ room they take stays charged (orphans_) until polled, so a
  // new QP cannot be admitted into it.
  std::lock_guard lock(ring_lock_);
  uint64_t n = 0;
  for (uint64_t i = head_; i != tail_; ++i) {
    CqEntry& e = ring_[i % ring_.size()];
    if (e.retire_qp != qp) continue;
    if (e.retire == Retire::kSrq && qp->srq() != nullptr) qp->srq()->retire_one();
    e.retire_qp = nullptr;
    e.retire = Retire::kOrphan;
    ++n;
  }
  orphans_.fetch_add(n, std::memory_order_relaxed);
}

void TcpCq::push(const CqEntry& entry) noexcept {
  {
    std::lock_guard lock(ring_lock_);
    if (tail_ - head_ >= ring_.size()) {
      // Unreachable: reserve() keeps the attached depths within capacity and
      // every completion holds a queue slot until it is polled. Kept as a loud
      // check rather than a silent overwrite.
      if (overflows_++ == 0) {
        core::log().critical(
            "tcp: completion queue overrun (capacity {}): internal error", ring_.size());
      }
      return;
    }
    ring_[tail_++ % ring_.size()] = entry;
  }
  if (armed_.exchange(false, std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(event_fd_.get(), &one, sizeof one);
  }
}

int TcpCq::poll(std::span<Completion> out) noexcept {
  const int64_t now = now_ns();
  last_poll_ns_.store(now, std::memory_order_relaxed);
  // The poller drives its queue pairs' sockets itself: no thread hop on the
  // latency path. try_lock: QP creation/destruction never blocks a poll.
  if (std::unique_lock attach(attach_mu_, std::try_to_lock); attach) {
    for (TcpQp* qp : qps_) qp->try_progress(now);
  }
  int n = 0;
  std::lock_guard lock(ring_lock_);
  while (n < static_cast<int>(out.size()) && head_ != tail_) {
    CqEntry& e = ring_[head_++ % ring_.size()];
    out[n++] = e.c;
    // verbs slot rule: a queue slot is free once its completion is polled.
    if (e.retire == Retire::kOrphan) {
      orphans_.fetch_sub(1, std::memory_order_relaxed);
    } else if (e.retire_qp != nullptr) {
      switch (e.retire) {
        case Retire::kSend: e.retire_qp->retire_to(e.retire_seq + 1); break;
        case Retire::kRecv: e.retire_qp->retire_recv(); break;
        case Retire::kSrq: e.retire_qp->srq()->retire_one(); break;
        case Retire::kNone:
        case Retire::kOrphan: break;
      }
    }
  }
  return n;
}

bool TcpCq::arm() noexcept {
  uint64_t drained;
  [[maybe_unused]] auto r = ::read(event_fd_.get(), &drained, sizeof drained);
  armed_.store(true, std::memory_order_seq_cst);
  bool pending;
  {
    std::lock_guard lock(ring_lock_);
    pending = head_ != tail_;
  }
  if (pending) {
    armed_.store(false, std::memory_order_seq_cst);
    return false;
  }
  // From now on the progress thread serves our QPs (driving() is false). If
  // it stood back from one while we were polling, its epoll registration is
  // spent: wake it now rather than at its next tick.
  bool deferred = false;
  if (std::unique_lock attach(attach_mu_, std::try_to_lock); attach) {
    for (TcpQp* qp : qps_) deferred |= qp->wants_service();
  } else {
    deferred = true;
  }
  if (deferred) progress_->kick();
  return true;
}

}  // namespace rdmakit::tcp
