// Completion queue: ibv_cq + its own completion channel (the fd of the
// epoll/blocking modes). arm() = ibv_req_notify_cq, then a re-poll whose
// find, if any, is stashed and returned by the next poll().
#include "providers/verbs/verbs_cq.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <thread>

#include "providers/verbs/verbs_qp.hpp"
#include "providers/verbs/verbs_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {
VerbsCq::VerbsCq(std::shared_ptr<Device> device, const CqOptions& options)
    : CompletionQueue(options), device_(std::move(device)) {
  const auto max_cqe = static_cast<uint32_t>(device_->info.attr.max_cqe);
  budget_ = core::CqBudget(options.capacity);
  if (options.capacity == 0 || options.capacity > max_cqe) {
    throw Error("create_cq", kProvider, "", EINVAL,
                fmt::format("capacity {} is outside 1..{} (max_cqe of {})",
                            options.capacity, max_cqe, device_->name()));
  }
  channel_.reset(ibv_create_comp_channel(device_->context));
  if (!channel_) {
    throw Error("ibv_create_comp_channel", kProvider, "", errno,
                "device " + device_->name());
  }
  // poll() and arm() read events without blocking; sleeping is poll(2)'s job.
  const int flags = fcntl(channel_->fd, F_GETFL);
  if (flags < 0 || fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error("fcntl(O_NONBLOCK)", kProvider, "", errno, "completion channel");
  }
  cq_.reset(ibv_create_cq(device_->context, static_cast<int>(options.capacity), this,
                          channel_.get(), 0));
  if (!cq_) {
    throw Error("ibv_create_cq", kProvider, "", errno,
                fmt::format("{} entries on {}", options.capacity, device_->name()));
  }
}

VerbsCq::~VerbsCq() {
  // Events received but not acknowledged would make ibv_destroy_cq wait.
  consume_event();
}

void VerbsCq::attach(QpCore* core, uint32_t depth, const std::string& peer) {
  std::lock_guard lock(qps_mutex_);
  budget_.charge(depth, "create_qp", kProvider, peer);
  qps_.push_back(core);
}

void VerbsCq::detach(QpCore* core, uint32_t depth) noexcept {
  std::lock_guard lock(qps_mutex_);
  // A shared CQ holds the QP twice (send and receive side): drop one.
  if (auto it = std::find(qps_.begin(), qps_.end(), core); it != qps_.end())
    qps_.erase(it);
  if (std::find(qps_.begin(), qps_.end(), core) == qps_.end() && last_ == core)
    last_ = nullptr;
  budget_.refund(depth);
}

void VerbsCq::attach_srq(QpCore* core, const std::shared_ptr<SrqCore>& srq,
                         const std::string& peer) {
  std::lock_guard lock(qps_mutex_);
  auto use = std::find_if(srqs_.begin(), srqs_.end(),
                          [&](const SrqUse& u) { return u.srq == srq; });
  if (use == srqs_.end() || use->qps == 0) {
    budget_.charge(srq->capacity, "create_qp", kProvider, peer);
  }
  if (use == srqs_.end()) {
    srqs_.push_back({srq, 1});
  } else {
    ++use->qps;
  }
  qps_.push_back(core);
}

void VerbsCq::detach_srq(QpCore* core, const SrqCore* srq) noexcept {
  std::lock_guard lock(qps_mutex_);
  if (auto it = std::find(qps_.begin(), qps_.end(), core); it != qps_.end())
    qps_.erase(it);
  if (std::find(qps_.begin(), qps_.end(), core) == qps_.end() && last_ == core)
    last_ = nullptr;
  for (SrqUse& use : srqs_) {
    // The entry (and the core) stays for completions still queued here.
    if (use.srq.get() == srq && use.qps > 0 && --use.qps == 0)
      budget_.refund(srq->capacity);
  }
}

void VerbsCq::consume_event() noexcept {
  if (!armed_) return;
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  // Non-blocking channel: EAGAIN when the event has not fired yet.
  if (ibv_get_cq_event(channel_.get(), &cq, &context) == 0) {
    ibv_ack_cq_events(cq, 1);
    armed_ = false;
  }
}

bool VerbsCq::translate(const ibv_wc& wc, Completion* out) noexcept {
  // An SRQ slot is freed whether or not its QP still exists.
  const bool srq_recv = SrqCore::is_srq_recv(wc.wr_id);
  const uint64_t srq_wr_id = srq_recv ? SrqCore::complete(wc.wr_id) : 0;
  QpCore* core = last_;
  if (core == nullptr || core->qp_num != wc.qp_num) {
    core = nullptr;
    for (QpCore* candidate : qps_) {
      if (candidate->qp_num == wc.qp_num) {
        core = candidate;
        break;
      }
    }
    // A QP destroyed with completions still queued: drop them, as mlx5
    // does when it cleans the CQ at ibv_destroy_qp.
    if (core == nullptr) return false;
    last_ = core;
  }
  // A device need not flush RECVs posted after its QP entered the error
  // state (rxe does not), and a poster that checked `failed` before this
  // store will not flush them itself: the first failure seen moves the QP
  // to the error state again, which drains them now. Error path only.
  if (wc.status != IBV_WC_SUCCESS &&
      !core->failed.exchange(true, std::memory_order_seq_cst) && core->qp != nullptr) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(core->qp, &attr, IBV_QP_STATE);
  }
  *out = Completion{};
  out->status = map_wc_status(wc.status);
  out->vendor_err = wc.vendor_err;
  out->qp_num = wc.qp_num;
  out->byte_len = wc.byte_len;
  if (wc.wc_flags & IBV_WC_WITH_IMM) {
    out->imm = ntohl(wc.imm_data);
    out->flags |= kCompletionHasImm;
  }
  const uint64_t seq = wc.wr_id & ~QpCore::kRecvBit;
  if (srq_recv) {
    out->wr_id = srq_wr_id;
    out->opcode = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM
                      ? Opcode::kRecvWriteWithImm
                      : Opcode::kRecv;
  } else if (wc.wr_id & QpCore::kRecvBit) {
    core->recv_published.load(std::memory_order_acquire);
    out->wr_id = core->recv_ring[seq & core->recv_mask];
    out->opcode = wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM
                      ? Opcode::kRecvWriteWithImm
                      : Opcode::kRecv;
    // Receives always complete one by one, in order.
    if (seq + 1 > core->recv_retired.load(std::memory_order_relaxed)) {
      core->recv_retired.store(seq + 1, std::memory_order_release);
    }
  } else if (seq == 0 && core->handshake_status.load(std::memory_order_acquire) ==
                             QpCore::kHandshakePending) {
    // accept()'s READ of the connect private data: for accept(), not the
    // application (wait_handshake()).
    if (core->send_retired.load(std::memory_order_relaxed) == 0) {
      core->send_retired.store(1, std::memory_order_release);
    }
    core->handshake_status.store(static_cast<int>(wc.status), std::memory_order_release);
    return false;
  } else {
    core->send_published.load(std::memory_order_acquire);
    const QpCore::SendSlot& slot = core->send_ring[seq & core->send_mask];
    out->wr_id = slot.wr_id;
    out->opcode = slot.opcode;
    // This completion retires itself and every unsignaled send before it
    // (never backwards: a late error of the handshake SEND is sequence 0).
    if (seq + 1 > core->send_retired.load(std::memory_order_relaxed)) {
      core->send_retired.store(seq + 1, std::memory_order_release);
    }
  }
  return true;
}

std::optional<ibv_wc> VerbsCq::poll_handshake(QpCore* core) {
  // The CQ may be polled by its owner thread meanwhile (QPs may be accepted
  // while it polls): whichever thread sees the READ's completion records it
  // in the QpCore (translate()); other completions this thread polls wait in
  // pending_ for the owner. The owner's arm() stash is never touched here.
  for (;;) {
    const int status = core->handshake_status.load(std::memory_order_acquire);
    if (status >= 0) {
      core->handshake_status.store(QpCore::kHandshakeIdle, std::memory_order_relaxed);
      ibv_wc wc{};
      wc.status = static_cast<ibv_wc_status>(status);
      wc.qp_num = core->qp_num;
      return wc;
    }
    ibv_wc wc{};
    if (ibv_poll_cq(cq_.get(), 1, &wc) != 1) return std::nullopt;
    std::lock_guard lock(qps_mutex_);
    Completion c;
    if (translate(wc, &c)) {
      pending_.push_back(c);
      has_pending_.store(true, std::memory_order_release);
    }
  }
}

int VerbsCq::poll(std::span<Completion> out) noexcept {
  consume_event();
  size_t count = 0;
  if (out.empty()) return 0;
  std::unique_lock lock(qps_mutex_, std::defer_lock);
  if (has_stash_) {
    lock.lock();
    has_stash_ = false;
    if (translate(stash_, &out[count])) ++count;
  }
  // Completions set aside while an accept waited for its handshake (rare).
  if (has_pending_.load(std::memory_order_acquire)) {
    if (!lock.owns_lock()) lock.lock();
    while (pending_head_ < pending_.size() && count < out.size()) {
      out[count++] = pending_[pending_head_++];
    }
    if (pending_head_ == pending_.size()) {
      pending_.clear();  // keeps capacity: no allocation on the next round
      pending_head_ = 0;
      has_pending_.store(false, std::memory_order_relaxed);
    }
  }
  constexpr int kBatch = 32;
  ibv_wc wcs[kBatch];
  while (count < out.size()) {
    const int want = static_cast<int>(std::min<size_t>(kBatch, out.size() - count));
    const int n = ibv_poll_cq(cq_.get(), want, wcs);
    if (n <= 0) break;  // empty, or the device is gone (nothing to report then)
    if (!lock.owns_lock()) lock.lock();
    for (int i = 0; i < n; ++i) {
      if (translate(wcs[i], &out[count])) ++count;
    }
    if (n < want) break;
  }
  return static_cast<int>(count);
}

bool VerbsCq::arm() noexcept {
  consume_event();  // clears the fd's readiness
  if (has_stash_ || has_pending_.load(std::memory_order_acquire)) return false;
  if (!armed_) {
    if (ibv_req_notify_cq(cq_.get(), 0) != 0) return false;  // poll instead of sleeping
    armed_ = true;
  }
  // A completion that landed before the request armed would never signal.
  if (ibv_poll_cq(cq_.get(), 1, &stash_) == 1) {
    has_stash_ = true;
    return false;
  }
  return true;
}

}  // namespace rdmakit::verbs
