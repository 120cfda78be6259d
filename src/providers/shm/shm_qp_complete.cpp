// The shm queue pair's progress and completions: requests queued behind an
// RNR wait, send completions, the error state, and the receive side's
// slow paths (SRQ entries, payload socket, flushes).
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include "providers/shm/shm_cq.hpp"
#include "providers/shm/shm_qp.hpp"
#include "providers/shm/shm_srq.hpp"

namespace rdmakit::shm {

void ShmQp::progress() noexcept {
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  if (state_ == QpState::kConnected &&
      (peer_gone() ||
       peer_block_->owner_state.load(std::memory_order_acquire) != kSideOpen ||
       local_.block->sender_state.load(std::memory_order_acquire) != kSideOpen)) {
    // The peer died or its QP left the connected state: nothing can
    // complete any more (as a NIC whose transport retries run out).
    if (sq_executed_ != sq_posted_) {
      complete_send(sq_[sq_executed_ & sq_mask_].wr, Status::kRetryExceeded);
      ++sq_executed_;
    }
    // No RNR wait is pending any more (else arm() paced retries forever).
    rnr_deadline_set_ = false;
    enter_error();
  }
  while (sq_executed_ != sq_posted_) {
    const SendWr& wr = sq_[sq_executed_ & sq_mask_].wr;
    if (state_ != QpState::kConnected) {
      complete_send(wr, Status::kWrFlushError);
      ++sq_executed_;
      continue;
    }
    Status status = Status::kSuccess;
    if (execute(wr, &status) == Exec::kBlocked) {
      const auto now = std::chrono::steady_clock::now();
      if (!rnr_deadline_set_) {
        rnr_deadline_set_ = true;
        rnr_deadline_ = now + options_.rnr_timeout;
        return;
      }
      if (now < rnr_deadline_) return;
      status = Status::kRnrRetryExceeded;
    }
    rnr_deadline_set_ = false;
    complete_send(wr, status);
    ++sq_executed_;
    if (status != Status::kSuccess) enter_error();
  }
  if (options_.thread_safe) sq_queued_.store(false, std::memory_order_release);
}

void ShmQp::push_send_completion(const SendWr& wr, Status status) noexcept {
  bool locked;
  {
    const auto guard = send_cq_->producer_guard();
    locked = guard.locked();
    Completion& c = send_cq_->push(this, sq_executed_ + 1);
    c.wr_id = wr.wr_id;
    c.byte_len = wr.length;
    c.imm = 0;
    c.qp_num = qp_num();
    c.opcode = wr.opcode;
    c.status = status;
    c.flags = 0;
    c.reserved = 0;
    c.vendor_err = 0;
  }
  // Several producers, or a caller that posts from any thread: this may not
  // be the thread that sleeps on the CQ.
  if (locked || options_.caller_serializes) send_cq_->wake_if_armed();
}

void ShmQp::enter_error() noexcept {
  QpState expected = QpState::kConnected;
  if (!state_.compare_exchange_strong(expected, QpState::kError)) return;
  local_.block->owner_state.store(kSideError, std::memory_order_seq_cst);
  peer_block_->sender_state.store(kSideError, std::memory_order_seq_cst);
  wake_peer();
  // Our own sleepers must see the flushes.
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(send_cq_->wake_fd(), &one, sizeof one);
  n = ::write(recv_cq_->wake_fd(), &one, sizeof one);
}

bool ShmQp::rnr_waiting() const noexcept {
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  return rnr_deadline_set_;
}

bool ShmQp::send_ready() const noexcept {
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  if (state_ == QpState::kConnected && peer_gone()) return true;
  return sq_executed_ != sq_posted_ && !rnr_deadline_set_;
}

bool ShmQp::recv_ready() const noexcept {
  // seq_cst pairs with the sender's done_seq store / cq_armed load.
  if (recv_done(std::memory_order_seq_cst)) return true;
  if (state_ == QpState::kConnected &&
      (peer_gone() ||
       local_.block->sender_state.load(std::memory_order_seq_cst) != kSideOpen)) {
    return true;
  }
  if (state_ == QpState::kConnected) return false;
  if (srq_ != nullptr) return peer_gone() && claimed_srq_entry() != 0;
  return rq_polled_ != rq_posted_.load(std::memory_order_acquire);
}

void ShmQp::take_srq_recv(uint64_t index, Completion* c) noexcept {
  RecvSlot& slot = local_.block->slots()[index];
  const uint64_t claimed =
      std::atomic_ref<uint64_t>(slot.srq_entry).load(std::memory_order_relaxed);
  if (srq_->valid_claim(claimed) &&
      srq_->claim_is_live(static_cast<uint32_t>(claimed - 1))) {
    const auto entry = static_cast<uint32_t>(claimed - 1);
    fill_recv_completion(slot, srq_->posted(entry), c);
    srq_->release(entry);
  } else {
    // A corrupt claim names no RECV of ours that a sender took: nothing is
    // copied anywhere, and no RECV completes twice.
    fill_recv_completion(slot, {0, nullptr, 0}, c);
    c->status = Status::kLocalQpOperationError;
  }
  std::atomic_ref<uint64_t>(slot.srq_entry).store(0, std::memory_order_relaxed);
  // Renew the credit: this slot carries completion rq_polled_ + ring next.
  slot.post_seq.store(rq_polled_ + 1 + local_.ring_size, std::memory_order_release);
}

uint64_t ShmQp::claimed_srq_entry() const noexcept {
  RecvSlot& slot = local_.block->slots()[rq_polled_ & rq_mask_];
  return std::atomic_ref<uint64_t>(slot.srq_entry).load(std::memory_order_acquire);
}

Status ShmQp::take_socket_payload(const PostedRecv& posted,
                                  uint32_t byte_len) const noexcept {
  if (!local_.payload_rx) return Status::kLocalQpOperationError;
  ssize_t got;
  do {
    got = ::recv(local_.payload_rx.get(), posted.addr, posted.length,
                 MSG_DONTWAIT | MSG_TRUNC);
  } while (got < 0 && errno == EINTR);
  // MSG_TRUNC: the message's real length, so a longer one is caught too.
  return got == static_cast<ssize_t>(byte_len) ? Status::kSuccess
                                               : Status::kLocalQpOperationError;
}

Completion ShmQp::flushed_recv(uint64_t wr_id) const noexcept {
  Completion c;
  c.wr_id = wr_id;
  c.status = Status::kWrFlushError;
  c.opcode = Opcode::kRecv;
  c.qp_num = qp_num();
  return c;
}

int ShmQp::poll_recv_idle(std::span<Completion> out, size_t n) noexcept {
  if (state_ == QpState::kConnected &&
      (peer_gone() ||
       local_.block->sender_state.load(std::memory_order_acquire) != kSideOpen)) {
    enter_error();
  }
  if (state_ == QpState::kConnected || recv_done(std::memory_order_acquire)) {
    return static_cast<int>(n);
  }
  if (srq_ != nullptr) {
    // The SRQ itself is never flushed. Only an entry a dead sender claimed
    // but never completed comes back, flushed on this QP.
    const uint64_t claimed = peer_gone() ? claimed_srq_entry() : 0;
    if (srq_->valid_claim(claimed) &&
        srq_->claim_is_live(static_cast<uint32_t>(claimed - 1)) && n < out.size()) {
      const auto entry = static_cast<uint32_t>(claimed - 1);
      out[n++] = flushed_recv(srq_->posted(entry).wr_id);
      srq_->release(entry);
      std::atomic_ref<uint64_t>(local_.block->slots()[rq_polled_ & rq_mask_].srq_entry)
          .store(0, std::memory_order_relaxed);
    }
    return static_cast<int>(n);
  }
  // In error the peer no longer consumes our ring: flush what is left, but
  // not a RECV whose buffer a live sender is still writing (see begin_fill):
  // it completes when the sender publishes it. Nor one published since the
  // check above: the next poll takes it as it completed.
  while (n < out.size() && rq_polled_ < rq_posted_.load(std::memory_order_acquire)) {
    const RecvSlot& slot = local_.block->slots()[rq_polled_ & rq_mask_];
    // seq_cst: pairs with begin_fill()'s store and load (enter_error()
    // stored owner_state seq_cst before this).
    const uint64_t done = slot.done_seq.load(std::memory_order_seq_cst);
    if (done == rq_polled_ + 1 ||
        (done == ((rq_polled_ + 1) | kSlotFilling) && !peer_gone())) {
      break;
    }
    out[n++] = flushed_recv(rq_[rq_polled_ & rq_mask_].wr_id);
    ++rq_polled_;
  }
  rq_polled_shared_.store(rq_polled_, std::memory_order_release);
  return static_cast<int>(n);
}

}  // namespace rdmakit::shm
