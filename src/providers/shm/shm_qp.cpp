// The shm data path, top to bottom: posting (with the small-SEND fast
// path), execution of each request against the peer's memory, then
// progress and completions. Longer than ~600 lines on purpose: the fast
// path (try_small_send) inlines publish_recv, recv_buffer_writable and
// the region-table reads defined below, which it can only do within one
// translation unit. Connection setup is in shm_handshake.cpp.
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
#include "providers/shm/asymmetric_fence.hpp"
#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_cq.hpp"
#include "providers/shm/shm_srq.hpp"
#include "providers/shm/small_copy.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

using core::is_sink;

static_assert(kSlotInline <= kSmallCopyMax, "inline slot payloads use small_copy");

// Snapshot of a live region entry, or false if key does not name one.
struct EntryView {
  uint32_t access;
  RegionKind kind;
  uint64_t addr;
  uint64_t length;
};

bool read_entry(const RegionTable& table, uint32_t key, EntryView* view) noexcept {
  if (key == 0) return false;
  const RegionEntry& e = table.entries[key & kRegionIndexMask];
  if (e.key.load(std::memory_order_acquire) != key) return false;
  // Acquire loads keep the second key load after the field loads (a
  // seqlock read without a standalone fence, which TSan cannot model).
  view->access = e.access.load(std::memory_order_acquire);
  view->kind = static_cast<RegionKind>(e.kind.load(std::memory_order_acquire));
  view->addr = e.addr.load(std::memory_order_acquire);
  view->length = e.length.load(std::memory_order_acquire);
  return e.key.load(std::memory_order_relaxed) == key;
}

// Requests a line in exclusive state without waiting for it, so a later
// store to it does not stall on the transfer from the other core.
inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}

bool in_range(const EntryView& view, uint64_t addr, uint64_t length) noexcept {
  return addr >= view.addr && length <= view.length &&
         addr - view.addr <= view.length - length;
}

}  // namespace

// ---------------------------------------------------------------- posting

// One small SEND on an idle, healthy QP whose peer has its own receive
// queue and a RECV posted: the common message of a request/response
// exchange. It runs the general path's checks in the same order, but
// without its per-request bookkeeping; anything unusual (RNR, a too-small
// or unregistered receive buffer, a lkey to check) returns false and takes
// the general path, which reports it.
inline bool ShmQueuePair::try_small_send(const SendWr& wr) noexcept {
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
    small_copy<kSlotInline>(slot.data, wr.local_addr, wr.length);
  }
  slot.data_inline = wr.length != 0 ? kPayloadInSlot : kPayloadInBuffer;
  publish_recv(slot, wr, Opcode::kRecv, Status::kSuccess);
  ++sq_posted_;
  complete_send(wr, Status::kSuccess);
  ++sq_executed_;
  return true;
}

PostResult ShmQueuePair::do_post_send(std::span<const SendWr> wrs) noexcept {
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
[[gnu::noinline]] PostResult ShmQueuePair::post_send_general(
    std::span<const SendWr> wrs) noexcept {
  std::unique_lock lock(post_mutex_, std::defer_lock);
  if (options_.thread_safe) lock.lock();
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
      copy_bytes(copy, wr.local_addr, wr.length);
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

PostResult ShmQueuePair::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  if (srq_ != nullptr) return {PostStatus::kInvalidArgument, 0};  // post to the SRQ
  std::unique_lock lock(post_mutex_, std::defer_lock);
  if (options_.thread_safe) lock.lock();
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

Status ShmQueuePair::check_local(const SendWr& wr, bool sink) const noexcept {
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

ShmQueuePair::Mapping& ShmQueuePair::mapping_for(uint32_t rkey) noexcept {
  static_assert((kInitialMappings & (kInitialMappings - 1)) == 0 &&
                kInitialMappings <= kRegionTableSize);
  Mapping* m = &mappings_[rkey & mapping_mask_];
  if (m->key == rkey) [[likely]]
    return *m;  // mapped: the data path's only case, as cheap as the old table
  while (m->base != nullptr && ((m->key ^ rkey) & kRegionIndexMask) != 0) {
    // Another region's mapping: double the cache rather than evict (two
    // regions used in turn would remap on every access). Entries distinct
    // modulo n stay distinct modulo 2n.
    const uint32_t size = (mapping_mask_ + 1) * 2;  // <= kRegionTableSize: indices differ
    auto grown = std::unique_ptr<Mapping[]>(new (std::nothrow) Mapping[size]);
    if (!grown) {
      ::munmap(m->base, m->bytes);  // no memory: evict, it is mapped again on use
      *m = Mapping{};
      break;
    }
    for (uint32_t i = 0; i <= mapping_mask_; ++i) {
      if (mappings_[i].base != nullptr)
        grown[mappings_[i].key & (size - 1)] = mappings_[i];
    }
    mappings_ = std::move(grown);
    mapping_mask_ = size - 1;
    m = &mappings_[rkey & mapping_mask_];
  }
  return *m;
}

ShmQueuePair::Target ShmQueuePair::resolve(uint32_t rkey, uint64_t addr, uint64_t length,
                                           uint32_t need, bool want_write) noexcept {
  Target target;
  EntryView view;
  if (!read_entry(*peer_table_, rkey, &view) || !in_range(view, addr, length) ||
      (view.access & need) != need) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  // Memory given to register_memory(), and a RECV buffer that grants no
  // remote write, are reached through the kernel (process_vm_*): only by a
  // process of the same user, at the pid the kernel named.
  if (view.kind == RegionKind::kUser ||
      (want_write && (view.access & (kAccessRemoteWrite | kAccessRemoteAtomic)) == 0)) {
    if (peer_.other_user) {
      target.status = Status::kRemoteAccessError;
      return target;
    }
    target.user_addr = addr;
    return target;
  }
  Mapping& m = mapping_for(rkey);
  if (m.key != rkey) {
    // First touch of this region: ask the owner's progress thread for its
    // memfd (read-only unless the region grants remote writes).
    if (m.base != nullptr) {
      ::munmap(m.base, m.bytes);
      m = Mapping{};
    }
    Request request{RequestOp::kGetRegion, rkey, 0, 0, 0};
    Reply reply{};
    Fd fd[1];
    size_t nfds = 0;
    if (send_with_fds(peer_.request_socket.get(), &request, sizeof request, {}) != 0 ||
        recv_with_fds(peer_.request_socket.get(), &reply, sizeof reply, fd, &nfds,
                      options_.peer_timeout) != static_cast<ssize_t>(sizeof reply)) {
      target.status = Status::kRetryExceeded;
      return target;
    }
    if (reply.status != static_cast<uint32_t>(Status::kSuccess) || nfds != 1) {
      target.status = static_cast<Status>(reply.status);
      return target;
    }
    const size_t bytes = view.length == 0 ? 1 : view.length;
    void* base = sealed_and_sized(fd[0].get(), bytes)
                     ? map_fd(fd[0].get(), bytes, reply.writable != 0, true)
                     : nullptr;
    if (base == nullptr) {
      target.status = Status::kRemoteOperationError;
      return target;
    }
    m.key = rkey;
    m.writable = reply.writable != 0;
    m.base = static_cast<std::byte*>(base);
    m.bytes = bytes;
    m.region_addr = view.addr;
  }
  // The live entry passed; the mapping must contain the range too.
  if (addr < m.region_addr || length > m.bytes ||
      addr - m.region_addr > m.bytes - length) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  if (want_write && !m.writable) {
    target.status = Status::kRemoteAccessError;
    return target;
  }
  target.mapped = m.base + (addr - m.region_addr);
  target.writable = m.writable;
  return target;
}

Status ShmQueuePair::copy_to_peer(const Target& target, const void* src,
                                  size_t length) noexcept {
  if (length == 0) return Status::kSuccess;
  if (target.mapped != nullptr) {
    copy_bytes(target.mapped, src, length);
    return Status::kSuccess;
  }
  if (peer_.other_user) return Status::kRemoteAccessError;
  iovec local{const_cast<void*>(src), length};
  iovec remote{reinterpret_cast<void*>(target.user_addr), length};
  const ssize_t n = ::process_vm_writev(peer_.cred.pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(length)) return Status::kSuccess;
  return errno == ESRCH ? Status::kRetryExceeded : Status::kRemoteAccessError;
}

Status ShmQueuePair::copy_from_peer(const Target& target, void* dst,
                                    size_t length) noexcept {
  if (length == 0) return Status::kSuccess;
  if (target.mapped != nullptr) {
    copy_bytes(dst, target.mapped, length);
    return Status::kSuccess;
  }
  if (peer_.other_user) return Status::kRemoteAccessError;
  iovec local{dst, length};
  iovec remote{reinterpret_cast<void*>(target.user_addr), length};
  const ssize_t n = ::process_vm_readv(peer_.cred.pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(length)) return Status::kSuccess;
  return errno == ESRCH ? Status::kRetryExceeded : Status::kRemoteAccessError;
}

Status ShmQueuePair::remote_atomic(const SendWr& wr, uint64_t* old_value) noexcept {
  if (!core::atomic_aligned(wr.remote_addr)) return Status::kRemoteInvalidRequestError;
  // A peer of another user maps only regions that grant it writes: on any
  // other the owner performs the atomic (and checks it again).
  EntryView view;
  const bool owner_performs = peer_.other_user &&
                              read_entry(*peer_table_, wr.rkey, &view) &&
                              (view.access & kAccessRemoteWrite) == 0;
  Target target;
  if (!owner_performs) {
    target = resolve(wr.rkey, wr.remote_addr, 8, kAccessRemoteAtomic, true);
    if (target.status != Status::kSuccess) return target.status;
  }
  if (target.mapped != nullptr && target.writable) {
    std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(target.mapped));
    if (wr.opcode == Opcode::kFetchAdd) {
      *old_value = word.fetch_add(wr.compare_add);
    } else {
      uint64_t expected = wr.compare_add;
      word.compare_exchange_strong(expected, wr.swap);
      *old_value = expected;
    }
    return Status::kSuccess;
  }
  // Registered user memory cannot be mapped here: the owner performs it.
  Request request{
      wr.opcode == Opcode::kFetchAdd ? RequestOp::kFetchAdd : RequestOp::kCompareSwap,
      wr.rkey, wr.remote_addr, wr.compare_add, wr.swap};
  Reply reply{};
  size_t nfds = 0;
  if (send_with_fds(peer_.request_socket.get(), &request, sizeof request, {}) != 0 ||
      recv_with_fds(peer_.request_socket.get(), &reply, sizeof reply, {}, &nfds,
                    options_.peer_timeout) != static_cast<ssize_t>(sizeof reply)) {
    return Status::kRetryExceeded;
  }
  *old_value = reply.value;
  return static_cast<Status>(reply.status);
}

bool ShmQueuePair::claim_recv(RecvClaim* claim) noexcept {
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

inline bool ShmQueuePair::recv_buffer_writable(uint32_t lkey, uint64_t addr,
                                               uint32_t length) const noexcept {
  EntryView view;
  return read_entry(*peer_table_, lkey, &view) && in_range(view, addr, length) &&
         (view.access & kAccessLocalWrite) != 0;
}

// Always inlined: the small-SEND path measured 22 -> 36 ns per message
// (rdmakit-path-cost) when this and recv_buffer_writable were calls.
[[gnu::always_inline]] inline void ShmQueuePair::publish_recv(
    RecvSlot& slot, const SendWr& wr, Opcode recv_opcode, Status recv_status) noexcept {
  slot.byte_len = wr.length;
  slot.imm = wr.imm;
  slot.flags = (wr.opcode == Opcode::kSendWithImm || wr.opcode == Opcode::kWriteWithImm)
                   ? kCompletionHasImm
                   : 0;
  slot.opcode = static_cast<uint8_t>(recv_opcode);
  slot.status = static_cast<uint8_t>(recv_status);
  publish(slot);
}

inline void ShmQueuePair::publish(RecvSlot& slot) noexcept {
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
bool ShmQueuePair::begin_fill(RecvSlot& slot) noexcept {
  if (peer_srq_ != nullptr) return true;
  const uint64_t before = slot.done_seq.load(std::memory_order_relaxed);
  slot.done_seq.store((peer_consumed_ + 1) | kSlotFilling, std::memory_order_seq_cst);
  if (peer_block_->owner_state.load(std::memory_order_seq_cst) == kSideOpen) return true;
  slot.done_seq.store(before, std::memory_order_release);
  return false;
}

ShmQueuePair::Exec ShmQueuePair::deliver(const SendWr& wr, Opcode recv_opcode,
                                         bool carry_payload, Status* status) noexcept {
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
        small_copy<kSlotInline>(slot.data, wr.local_addr, wr.length);
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

ShmQueuePair::Exec ShmQueuePair::write_with_imm(const SendWr& wr,
                                                Status* status) noexcept {
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

ShmQueuePair::Exec ShmQueuePair::execute(const SendWr& wr, Status* status) noexcept {
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

// ---------------------------------------------------------------- progress

void ShmQueuePair::progress() noexcept {
  std::unique_lock lock(post_mutex_, std::defer_lock);
  if (options_.thread_safe) lock.lock();
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

void ShmQueuePair::push_send_completion(const SendWr& wr, Status status) noexcept {
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

void ShmQueuePair::enter_error() noexcept {
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

void ShmQueuePair::signal_peer() noexcept {
  if (peer_.other_user) {
    // Its wake socket (checked at the handshake): never blocks, and a full
    // one already wakes it.
    const char one = 1;
    [[maybe_unused]] ssize_t n =
        ::send(peer_.cq_event.get(), &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    return;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(peer_.cq_event.get(), &one, sizeof one);
}

bool ShmQueuePair::rnr_waiting() const noexcept {
  std::unique_lock lock(post_mutex_, std::defer_lock);
  if (options_.thread_safe) lock.lock();
  return rnr_deadline_set_;
}

bool ShmQueuePair::send_ready() const noexcept {
  std::unique_lock lock(post_mutex_, std::defer_lock);
  if (options_.thread_safe) lock.lock();
  if (state_ == QpState::kConnected && peer_gone()) return true;
  return sq_executed_ != sq_posted_ && !rnr_deadline_set_;
}

bool ShmQueuePair::recv_ready() const noexcept {
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

void ShmQueuePair::take_srq_recv(uint64_t index, Completion* c) noexcept {
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

uint64_t ShmQueuePair::claimed_srq_entry() const noexcept {
  RecvSlot& slot = local_.block->slots()[rq_polled_ & rq_mask_];
  return std::atomic_ref<uint64_t>(slot.srq_entry).load(std::memory_order_acquire);
}

Status ShmQueuePair::take_socket_payload(const PostedRecv& posted,
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

Completion ShmQueuePair::flushed_recv(uint64_t wr_id) const noexcept {
  Completion c;
  c.wr_id = wr_id;
  c.status = Status::kWrFlushError;
  c.opcode = Opcode::kRecv;
  c.qp_num = qp_num();
  return c;
}

int ShmQueuePair::poll_recv_idle(std::span<Completion> out, size_t n) noexcept {
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
