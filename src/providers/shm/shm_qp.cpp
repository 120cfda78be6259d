// The shm data path: posting (with the small-SEND fast path) and the
// execution of each request, SEND and RECV matching in this file, one-sided
// access to the peer's memory in shm_qp_remote.cpp, progress and
// completions in shm_qp_complete.cpp. The fast path (try_small_send)
// inlines publish_recv, recv_buffer_writable and the region-table reads,
// which keeps them in this translation unit. Connection setup is in
// shm_handshake.cpp.
#include "providers/shm/shm_qp.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/address.hpp"
#include "core/log.hpp"
#include "core/work_request.hpp"
#include "providers/shm/shm_asymmetric_fence.hpp"
#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_cq.hpp"
#include "providers/shm/shm_small_copy.hpp"
#include "providers/shm/shm_srq.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

using core::is_sink;

static_assert(kSlotInline <= detail::kSmallCopyMax,
              "inline slot payloads use small_copy");

// Requests a line in exclusive state without waiting for it, so a later
// store to it does not stall on the transfer from the other core.
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}

}  // namespace

// ---------------------------------------------------------------- posting

// One small SEND on an idle, healthy QP whose peer has its own receive
// queue and a RECV posted: the common message of a request/response
// exchange. It runs the general path's checks in the same order, but
// without its per-request bookkeeping; anything unusual (RNR, a too-small
// or unregistered receive buffer, a lkey to check) returns false and takes
// the general path, which reports it.
inline bool ShmQp::try_small_send(const SendWr& wr) noexcept {
  if (!small_send_allowed_ || wr.length > small_send_max_ ||
      static_cast<uint8_t>(wr.opcode) > static_cast<uint8_t>(Opcode::kSendWithImm) ||
      ((wr.flags & kInline) == 0 && wr.length != 0) || sq_executed_ != sq_posted_ ||
      sq_posted_ - sq_retired_.load(std::memory_order_acquire) >= options_.max_send_wr ||
      !path_clear()) {
    return false;
  }
  RecvSlot& slot = peer_block_->slots()[peer_consumed_ & peer_ring_mask_];
  prefetch_for_write(&slot);
  if (slot.post_seq.load(std::memory_order_acquire) != peer_consumed_ + 1) return false;
  if (wr.length != 0) {
    if (wr.length > slot.length ||
        !recv_buffer_writable(slot.lkey, slot.addr, wr.length)) {
      return false;
    }
    detail::small_copy<kSlotInline>(slot.data, wr.local_addr, wr.length);
  }
  slot.data_inline = wr.length != 0 ? kPayloadInSlot : kPayloadInBuffer;
  publish_recv(slot, wr, Opcode::kRecv, Status::kSuccess);
  ++sq_posted_;
  complete_send(wr, Status::kSuccess);
  ++sq_executed_;
  return true;
}

PostResult ShmQp::do_post_send(std::span<const SendWr> wrs) noexcept {
  if (wrs.size() == 1) {
    if (!options_.thread_safe) {
      if (try_small_send(wrs[0])) return {PostStatus::kOk, 1};
    } else if (small_send_allowed_ && wrs[0].length <= small_send_max_ &&
               static_cast<uint8_t>(wrs[0].opcode) <=
                   static_cast<uint8_t>(Opcode::kSendWithImm)) {
      // A thread-safe QP takes the fast path under its post lock (it never
      // queues, so sq_queued_ stays as it is); a miss retakes the lock in
      // the general path, which is the rare case.
      std::lock_guard lock(post_mutex_);
      if (try_small_send(wrs[0])) return {PostStatus::kOk, 1};
    }
  }
  return post_send_general(wrs);
}

// Out of line, so the fast path above does not pay this one's stack frame.
[[gnu::noinline]] PostResult ShmQp::post_send_general(
    std::span<const SendWr> wrs) noexcept {
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  uint32_t accepted = 0;
  bool queued = false;
  // Nothing waiting and a healthy peer: execute straight from the caller's
  // request, without copying it into the send queue first.
  bool direct = sq_executed_ == sq_posted_ && path_clear();
  PostResult result;
  for (const SendWr& wr : wrs) {
    if (sq_posted_ - sq_retired_.load(std::memory_order_acquire) >=
        options_.max_send_wr) {
      result.status = PostStatus::kQueueFull;
      break;
    }
    if (const PostStatus bad = core::validate_send(wr, options_.max_inline);
        bad != PostStatus::kOk) {
      result.status = bad;
      break;
    }
    const bool inline_payload = (wr.flags & kInline) != 0;
    if (direct) {
      Status status = Status::kSuccess;
      if (execute(wr, &status) == Exec::kDone) {
        ++sq_posted_;
        complete_send(wr, status);
        ++sq_executed_;
        ++accepted;
        if (status != Status::kSuccess) {
          enter_error();
          direct = false;
        }
        continue;
      }
      direct = false;  // RNR: it and everything after it wait in the queue
    }
    const uint64_t slot = sq_posted_ & sq_mask_;
    SendWr& stored = sq_[slot].wr;
    stored = wr;
    if (inline_payload) {
      std::byte* copy = &inline_data_[slot * options_.max_inline];
      detail::copy_bytes(copy, wr.local_addr, wr.length);
      stored.local_addr = copy;
    }
    ++sq_posted_;
    ++accepted;
    queued = true;
  }
  result.posted = accepted;
  // Ring once: execute everything that was queued.
  if (queued) {
    if (lock.owns_lock()) {
      sq_queued_.store(true, std::memory_order_release);
      lock.unlock();
    }
    progress();
    // Queued behind an RNR wait from a thread that may not own the CQ: a
    // sleeping owner must re-arm, which sets the retry timer.
    if (options_.thread_safe || options_.caller_serializes)
      send_cq_->wake_if_armed_after_queueing();
  }
  return result;
}

PostResult ShmQp::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  if (srq_ != nullptr) return {PostStatus::kInvalidArgument, 0};  // post to the SRQ
  detail::ConditionalLock lock(post_mutex_, options_.thread_safe);
  PostResult result;
  RecvSlot* slots = local_.block->slots();
  for (const RecvWr& wr : wrs) {
    const uint64_t posted = rq_posted_.load(std::memory_order_relaxed);
    if (posted - rq_polled_shared_.load(std::memory_order_acquire) >=
        options_.max_recv_wr) {
      result.status = PostStatus::kQueueFull;
      break;
    }
    const uint64_t index = posted & rq_mask_;
    RecvSlot& slot = slots[index];
    slot.addr = reinterpret_cast<uint64_t>(wr.addr);
    slot.length = wr.length;
    slot.lkey = wr.lkey;
    rq_[index] = {wr.wr_id, static_cast<std::byte*>(wr.addr), wr.length};
    rq_posted_.store(posted + 1, std::memory_order_release);
    slot.post_seq.store(posted + 1, std::memory_order_release);
    ++result.posted;
  }
  return result;
}

// ---------------------------------------------------------------- execution

Status ShmQp::check_local(const SendWr& wr, bool sink) const noexcept {
  if (wr.length == 0) return Status::kSuccess;
  if ((wr.flags & kInline) != 0 && !sink) return Status::kSuccess;
  EntryView view;
  if (!read_entry(context_.table(), wr.lkey, &view) ||
      !in_range(view, reinterpret_cast<uint64_t>(wr.local_addr), wr.length) ||
      (sink && (view.access & kAccessLocalWrite) == 0)) {
    return Status::kLocalProtectionError;
  }
  return Status::kSuccess;
}

bool ShmQp::claim_recv(RecvClaim* claim) noexcept {
  RecvSlot& slot = peer_block_->slots()[peer_consumed_ & peer_ring_mask_];
  // We read the slot and then write it: fetch the line for writing once
  // instead of a shared read followed by an invalidation.
  prefetch_for_write(&slot);
  if (slot.post_seq.load(std::memory_order_acquire) != peer_consumed_ + 1) return false;
  claim->slot = &slot;
  if (peer_srq_ == nullptr) {
    claim->addr = slot.addr;
    claim->length = slot.length;
    claim->lkey = slot.lkey;
    return true;
  }
  // Take the oldest posted SRQ RECV; other senders race for it. The ring
  // slot can only be reused after `claimed` passed it, so what we read
  // before a successful compare-and-swap belongs to RECV n.
  const uint64_t srq_mask = peer_.srq_ring_size - 1;
  uint64_t n = peer_srq_->claimed.load(std::memory_order_acquire);
  for (;;) {
    const SrqRingSlot& ring_slot = peer_srq_->ring()[n & srq_mask];
    if (ring_slot.post_seq.load(std::memory_order_acquire) != n + 1) return false;
    const uint32_t entry = ring_slot.entry.load(std::memory_order_relaxed);
    if (peer_srq_->claimed.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel,
                                                 std::memory_order_acquire)) {
      if (entry > srq_mask) return false;  // a corrupt block: never write out of it
      // Recorded before anything else, so the owner can flush the entry
      // should we die before publishing the completion.
      std::atomic_ref<uint64_t>(slot.srq_entry)
          .store(entry + 1, std::memory_order_release);
      const SrqEntry& e = peer_srq_->entries()[entry];
      claim->addr = e.addr;
      claim->length = e.length;
      claim->lkey = e.lkey;
      return true;
    }
  }
}

inline bool ShmQp::recv_buffer_writable(uint32_t lkey, uint64_t addr,
                                        uint32_t length) const noexcept {
  EntryView view;
  return read_entry(*peer_table_, lkey, &view) && in_range(view, addr, length) &&
         (view.access & kAccessLocalWrite) != 0;
}

// Always inlined: the small-SEND path measured 22 -> 36 ns per message
// (rdmakit-path-cost) when this and recv_buffer_writable were calls.
[[gnu::always_inline]] inline void ShmQp::publish_recv(RecvSlot& slot, const SendWr& wr,
                                                       Opcode recv_opcode,
                                                       Status recv_status) noexcept {
  slot.byte_len = wr.length;
  slot.imm = wr.imm;
  slot.flags = (wr.opcode == Opcode::kSendWithImm || wr.opcode == Opcode::kWriteWithImm)
                   ? kCompletionHasImm
                   : 0;
  slot.opcode = static_cast<uint8_t>(recv_opcode);
  slot.status = static_cast<uint8_t>(recv_status);
  publish(slot);
}

inline void ShmQp::publish(RecvSlot& slot) noexcept {
  ++peer_consumed_;
  // Publish, then check whether the receiver sleeps. That store-load order
  // needs a full fence on one side: here per message, or (light_publish_)
  // in the receiver's arm() through heavy_fence().
  if (light_publish_) {
    slot.done_seq.store(peer_consumed_, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    slot.done_seq.store(peer_consumed_, std::memory_order_seq_cst);
  }
  wake_peer();
  // Not prefetching the next slot here: the receiver spins on it, so taking
  // it early only adds a transfer (measured: +30% half round trip).
}

// A large payload goes straight into the receiver's buffer: the slot says so
// first, so a receiver entering the error state does not flush (hand back)
// that buffer while we write into it. Sequentially consistent on both sides
// (enter_error() stores owner_state so), so one of the two sees the other;
// next to a copy of more than kSlotInline bytes the fence is cheap. SRQ
// buffers are never flushed.
bool ShmQp::begin_fill(RecvSlot& slot) noexcept {
  if (peer_srq_ != nullptr) return true;
  const uint64_t before = slot.done_seq.load(std::memory_order_relaxed);
  slot.done_seq.store((peer_consumed_ + 1) | kSlotFilling, std::memory_order_seq_cst);
  if (peer_block_->owner_state.load(std::memory_order_seq_cst) == kSideOpen) return true;
  slot.done_seq.store(before, std::memory_order_release);
  return false;
}

ShmQp::Exec ShmQp::deliver(const SendWr& wr, Opcode recv_opcode, bool carry_payload,
                           Status* status) noexcept {
  RecvClaim claim;
  if (!claim_recv(&claim)) return Exec::kBlocked;
  RecvSlot& slot = *claim.slot;
  Status recv_status = Status::kSuccess;
  slot.data_inline = kPayloadInBuffer;
  if (carry_payload) {
    if (wr.length > claim.length) {
      recv_status = Status::kLocalLengthError;
      *status = Status::kRemoteInvalidRequestError;
    } else if (wr.length != 0) {
      if (!recv_buffer_writable(claim.lkey, claim.addr, wr.length)) {
        recv_status = Status::kLocalProtectionError;
        *status = Status::kRemoteOperationError;
      } else if (wr.length <= kSlotInline) {
        // Small payloads ride in the slot's cache line; the receiver copies
        // them into its buffer when it polls.
        detail::small_copy<kSlotInline>(slot.data, wr.local_addr, wr.length);
        slot.data_inline = kPayloadInSlot;
      } else if (peer_.payload_socket) {
        // The receiver reads the payload into its buffer when it polls.
        const ssize_t sent = ::send(peer_.payload_socket.get(), wr.local_addr, wr.length,
                                    MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent == static_cast<ssize_t>(wr.length)) {
          slot.data_inline = kPayloadOnSocket;
        } else if (sent < 0 && (errno == EAGAIN || errno == ENOBUFS) &&
                   peer_srq_ == nullptr) {
          return Exec::kBlocked;  // the receiver has not read earlier ones yet
        } else {
          recv_status = Status::kLocalLengthError;
          *status = errno == EMSGSIZE ? Status::kLocalLengthError
                                      : Status::kRemoteOperationError;
        }
      } else if (!begin_fill(slot)) {
        // The receiver entered the error state: it flushes this RECV itself.
        *status = Status::kRetryExceeded;
        return Exec::kDone;
      } else {
        Target target =
            resolve(claim.lkey, claim.addr, wr.length, kAccessLocalWrite, true);
        if (target.status == Status::kSuccess) {
          target.status = copy_to_peer(target, wr.local_addr, wr.length);
        }
        if (target.status != Status::kSuccess) {
          recv_status = Status::kLocalProtectionError;
          *status = target.status == Status::kRetryExceeded
                        ? Status::kRetryExceeded
                        : Status::kRemoteOperationError;
        }
      }
    }
  }
  publish_recv(slot, wr, recv_opcode, recv_status);
  return Exec::kDone;
}

ShmQp::Exec ShmQp::write_with_imm(const SendWr& wr, Status* status) noexcept {
  // Check the target and claim the RECV before moving data, so an RNR retry
  // does not depend on the write being idempotent.
  Target target;
  if (wr.length != 0) {
    target = resolve(wr.rkey, wr.remote_addr, wr.length, kAccessRemoteWrite, true);
    if (target.status != Status::kSuccess) {
      *status = target.status;
      return Exec::kDone;
    }
  }
  RecvClaim claim;
  if (!claim_recv(&claim)) return Exec::kBlocked;
  claim.slot->data_inline = kPayloadInBuffer;
  if (wr.length != 0 && target.mapped != nullptr && context_.streaming_write_min() != 0 &&
      wr.length >= context_.streaming_write_min()) {
    // The receiver reads these bytes next, on its own core (opt-in).
    copy_streaming(target.mapped, wr.local_addr, wr.length);
  } else if (wr.length != 0) {
    *status = copy_to_peer(target, wr.local_addr, wr.length);
  }
  if (*status == Status::kSuccess) {
    publish_recv(*claim.slot, wr, Opcode::kRecvWriteWithImm, Status::kSuccess);
  } else if (peer_srq_ != nullptr) {
    // An SRQ entry cannot be handed back (others may have claimed later
    // ones): it completes, flushed, on this QP, which is going to error.
    publish_recv(*claim.slot, wr, Opcode::kRecvWriteWithImm, Status::kWrFlushError);
  }
  return Exec::kDone;
}

ShmQp::Exec ShmQp::execute(const SendWr& wr, Status* status) noexcept {
  *status = check_local(wr, is_sink(wr.opcode));
  if (*status != Status::kSuccess) return Exec::kDone;
  switch (wr.opcode) {
    case Opcode::kSend:
    case Opcode::kSendWithImm: return deliver(wr, Opcode::kRecv, true, status);
    case Opcode::kWriteWithImm: return write_with_imm(wr, status);
    case Opcode::kWrite: {
      if (wr.length != 0) {
        Target target =
            resolve(wr.rkey, wr.remote_addr, wr.length, kAccessRemoteWrite, true);
        if (target.status == Status::kSuccess) {
          target.status = copy_to_peer(target, wr.local_addr, wr.length);
        }
        *status = target.status;
      }
      return Exec::kDone;
    }
    case Opcode::kRead: {
      if (wr.length == 0) return Exec::kDone;
      Target target =
          resolve(wr.rkey, wr.remote_addr, wr.length, kAccessRemoteRead, false);
      if (target.status == Status::kSuccess) {
        target.status = copy_from_peer(target, wr.local_addr, wr.length);
      }
      *status = target.status;
      return Exec::kDone;
    }
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd: {
      uint64_t old_value = 0;
      *status = remote_atomic(wr, &old_value);
      if (*status == Status::kSuccess) std::memcpy(wr.local_addr, &old_value, 8);
      return Exec::kDone;
    }
    default: *status = Status::kLocalQpOperationError; return Exec::kDone;
  }
}

void ShmQp::signal_peer() noexcept {
  if (peer_.other_user) {
    // Its wake socket (checked at the handshake): never blocks, and a full
    // one already wakes it.
    const char one = 1;
    [[maybe_unused]] ssize_t n =
        ::send(peer_wake_->get(), &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    return;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(peer_wake_->get(), &one, sizeof one);
}

}  // namespace rdmakit::shm
