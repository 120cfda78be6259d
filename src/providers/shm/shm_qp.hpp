#pragma once
// The shm queue pair: the data path in shm_qp.cpp, shm_qp_remote.cpp and
// shm_qp_complete.cpp, its construction from what the handshake exchanged
// in shm_handshake.cpp.
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "providers/shm/shm_handshake.hpp"
#include "providers/shm/shm_layout.hpp"
#include "providers/shm/shm_link.hpp"
#include "providers/shm/shm_posted_recv.hpp"
#include "providers/shm/shm_unix_socket.hpp"
#include "rdmakit/detail/conditional_lock.hpp"
#include "rdmakit/detail/small_copy.hpp"
#include "rdmakit/queue_pair.hpp"

namespace rdmakit::shm {

// The data path: requests execute in the posting thread, in order. WRITE/READ
// and atomics on memfd regions are direct loads/stores/atomic_ref operations
// on the peer's memory; on registered user memory they use
// process_vm_readv/writev (atomics: the owner's progress thread). A SEND
// writes into the receive buffer the peer published in its receive ring.
class ShmQp final : public QueuePair {
 public:
  ShmQp(ShmContext& context, const QpOptions& options, LocalEnd local, PeerEnd peer);
  ~ShmQp() override;

  QpState state() const noexcept override {
    return state_.load(std::memory_order_acquire);
  }

  // Completion-queue side.
  // Owned by the receive CQ's poller (ShmCq::poll): whether the
  // QP is on that CQ's list of recently active QPs, and the poll it last
  // yielded a completion in.
  bool cq_hot = false;
  uint64_t cq_last_hit = 0;
  void progress() noexcept;
  // Inline (see the end of this file): the receive half of every poll.
  int poll_recv(std::span<Completion> out) noexcept;
  void retire(uint64_t upto) noexcept {
    if (upto > sq_retired_.load(std::memory_order_relaxed)) {
      sq_retired_.store(upto, std::memory_order_release);
    }
  }
  void set_cq_armed(bool armed) noexcept {
    local_.block->cq_armed.store(armed ? 1 : 0, std::memory_order_seq_cst);
  }
  bool recv_ready() const noexcept;
  bool send_ready() const noexcept;
  // Requests queued behind an RNR wait, or a dead peer to notice: only then
  // does polling have send-side work (everything else executes at post).
  // A thread-safe QP's counters belong to its post lock: the poller reads
  // sq_queued_ instead (set under that lock), and takes the lock only when
  // progress() has work: something queued, or a peer that left (the checks
  // progress() makes first). A poll of an idle thread-safe QP is lock-free.
  bool needs_progress() const noexcept {
    if (options_.thread_safe) {
      return sq_queued_.load(std::memory_order_acquire) ||
             (state_ == QpState::kConnected && !path_clear());
    }
    return sq_executed_ != sq_posted_ || (state_ == QpState::kConnected && peer_gone());
  }
  bool rnr_waiting() const noexcept;
  bool recv_done(std::memory_order order) const noexcept {
    const RecvSlot& slot = local_.block->slots()[rq_polled_ & rq_mask_];
    return slot.done_seq.load(order) == rq_polled_ + 1;
  }

 protected:
  PostResult do_post_send(std::span<const SendWr> wrs) noexcept override;
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  struct SqEntry {
    SendWr wr;
  };
  static_assert(std::is_trivially_copyable_v<SqEntry> &&
                    alignof(SqEntry) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                "SqEntry lives in uninitialized byte storage");
  // kBlocked: no RECV posted at the peer yet (RNR).
  enum class Exec : uint8_t { kDone, kBlocked };

  // A receive the peer posted (its own queue or its SRQ) that the current
  // request will complete.
  struct RecvClaim {
    RecvSlot* slot = nullptr;  // where the result goes (the peer's ring)
    uint64_t addr = 0;
    uint32_t length = 0;
    uint32_t lkey = 0;
  };

  struct Target {
    Status status = Status::kSuccess;
    std::byte* mapped = nullptr;  // direct pointer, or null for process_vm
    bool writable = false;
    uint64_t user_addr = 0;
  };

  // Connected, and neither side has left that state.
  bool path_clear() const noexcept {
    return state_ == QpState::kConnected && !peer_gone() &&
           peer_block_->owner_state.load(std::memory_order_acquire) == kSideOpen &&
           local_.block->sender_state.load(std::memory_order_acquire) == kSideOpen;
  }
  Exec execute(const SendWr& wr, Status* status) noexcept;
  Status check_local(const SendWr& wr, bool sink) const noexcept;
  Target resolve(uint32_t rkey, uint64_t addr, uint64_t length, uint32_t need,
                 bool want_write) noexcept;
  Status copy_to_peer(const Target& target, const void* src, size_t length) noexcept;
  Status copy_from_peer(const Target& target, void* dst, size_t length) noexcept;
  Status remote_atomic(const SendWr& wr, uint64_t* old_value) noexcept;
  // False: no receive posted (RNR). With an SRQ the entry is consumed here.
  bool claim_recv(RecvClaim* claim) noexcept;
  // The peer's RECV buffer [addr, addr + length) is registered under lkey
  // with LOCAL_WRITE.
  bool recv_buffer_writable(uint32_t lkey, uint64_t addr, uint32_t length) const noexcept;
  // Fills the result of the peer's RECV in slot and publishes it.
  void publish_recv(RecvSlot& slot, const SendWr& wr, Opcode recv_opcode,
                    Status recv_status) noexcept;
  bool try_small_send(const SendWr& wr) noexcept;
  bool begin_fill(RecvSlot& slot) noexcept;
  // The constructor's work; on a throw the constructor unmaps what it mapped.
  void set_up();
  void unmap_peer() noexcept;
  // Completes the peer's RECV in slot (its fields are filled).
  void publish(RecvSlot& slot) noexcept;
  Exec deliver(const SendWr& wr, Opcode recv_opcode, bool carry_payload,
               Status* status) noexcept;
  Exec write_with_imm(const SendWr& wr, Status* status) noexcept;
  // Our receive ring slot index i was consumed: the completion it describes.
  void take_recv(uint64_t index, Completion* c) noexcept;
  void take_srq_recv(uint64_t index, Completion* c) noexcept;
  void fill_recv_completion(const RecvSlot& slot, const PostedRecv& posted,
                            Completion* c) const noexcept;
  // Reads the next payload message into the posted buffer; it must be
  // exactly byte_len bytes.
  Status take_socket_payload(const PostedRecv& posted, uint32_t byte_len) const noexcept;
  // poll_recv once nothing (more) arrived: notices a dead or failed peer and
  // flushes; n completions are already in out.
  int poll_recv_idle(std::span<Completion> out, size_t n) noexcept;
  // A RECV completed with WR_FLUSH_ERROR (the QP is in error).
  Completion flushed_recv(uint64_t wr_id) const noexcept;
  // SRQ: entry + 1 a sender claimed for our next completion, 0 if none.
  uint64_t claimed_srq_entry() const noexcept;
  void complete_send(const SendWr& wr, Status status) noexcept {
    // Errors and flushes always complete, as on a NIC; success only if signaled.
    if (status == Status::kSuccess && (wr.flags & kSignaled) == 0) return;
    push_send_completion(wr, status);
  }
  void push_send_completion(const SendWr& wr, Status status) noexcept;
  // The general path: several requests, queued ones, errors.
  PostResult post_send_general(std::span<const SendWr> wrs) noexcept;
  void enter_error() noexcept;
  bool peer_gone() const noexcept { return peer_gone_->load(std::memory_order_acquire); }
  void wake_peer() noexcept {
    if (peer_block_->cq_armed.load(std::memory_order_seq_cst) != 0) signal_peer();
  }
  void signal_peer() noexcept;

  ShmContext& context_;
  LocalEnd local_;
  PeerEnd peer_;
  const RegionTable* peer_table_ = nullptr;  // peer_table_ref_.get(), one load closer
  std::shared_ptr<const RegionTable> peer_table_ref_;  // shared by the context's QPs
  InboundBlock* peer_block_ = nullptr;
  size_t peer_block_bytes_ = 0;
  SrqBlock* peer_srq_ = nullptr;  // the peer receives through an SRQ
  size_t peer_srq_bytes_ = 0;
  ShmSrq* srq_ = nullptr;            // we receive through an SRQ
  bool light_publish_ = false;       // see publish()
  bool small_send_allowed_ = false;  // see try_small_send()
  uint32_t small_send_max_ = 0;      // bytes
  uint64_t peer_ring_mask_ = 0;
  const std::atomic<bool>* peer_gone_;   // local_.link->peer_gone, one load closer
  std::shared_ptr<const Fd> peer_wake_;  // the peer's receive CQ wake (shared)
  ShmCq* send_cq_;
  ShmCq* recv_cq_;

  // Send queue: [sq_retired_, sq_executed_) done awaiting retirement,
  // [sq_executed_, sq_posted_) waiting (behind an RNR-blocked SEND).
  // Only requests that must wait (RNR, or queued behind one) are copied
  // here, so both arrays are left uninitialized: pages an idle or
  // never-blocked QP does not touch cost no memory.
  std::unique_ptr<std::byte[]> sq_storage_;
  SqEntry* sq_ = nullptr;                     // sq_mask_ + 1 entries in sq_storage_
  std::unique_ptr<std::byte[]> inline_data_;  // max_inline bytes per slot
  uint64_t sq_mask_ = 0;
  uint64_t sq_posted_ = 0;
  uint64_t sq_executed_ = 0;
  std::atomic<uint64_t> sq_retired_{0};  // the CQ's owner writes
  // Thread-safe QPs: sq_executed_ != sq_posted_, published under the post
  // lock, so a poll with nothing queued does not take that lock.
  std::atomic<bool> sq_queued_{false};
  bool rnr_deadline_set_ = false;
  std::chrono::steady_clock::time_point rnr_deadline_{};

  // Receive queue (our InboundBlock's ring), by slot: our own copy of each
  // posted RECV. The ring is writable by the peer, so where inline data goes
  // is never taken from it.
  std::vector<PostedRecv> rq_;
  uint64_t rq_mask_ = 0;
  std::atomic<uint64_t> rq_posted_{0};         // the posting thread writes
  uint64_t rq_polled_ = 0;                     // the CQ's owner: its own copy, and
  std::atomic<uint64_t> rq_polled_shared_{0};  // the one posting threads read

  uint64_t peer_consumed_ = 0;  // RECVs of the peer we consumed

  // Peer mappings by region index, filled on first access to each region.
  // What we mapped is all we trust: the peer can rewrite its table entry
  // under a live key, so every access is bounded by the address and length
  // the region had when we mapped it, and by the mapping itself.
  struct Mapping {
    uint32_t key = 0;
    bool writable = false;
    std::byte* base = nullptr;
    size_t bytes = 0;
    uint64_t region_addr = 0;  // the owner's address of base[0]
  };
  // Direct-mapped by region index modulo its size, which starts small and
  // doubles when two mapped regions collide (at kRegionTableSize it is one
  // entry per index): an idle QP touching one or two peer regions keeps a
  // few entries, not 4096 (160 KiB).
  static constexpr uint32_t kInitialMappings = 4;
  std::unique_ptr<Mapping[]> mappings_;
  uint32_t mapping_mask_ = 0;
  // The entry for rkey, grown so that no other mapped region holds it (an
  // entry of the same index but another generation is the caller's to drop).
  Mapping& mapping_for(uint32_t rkey) noexcept;

  // Atomic, as are the counters both sides of a QP read: a thread-safe QP
  // posts from any thread while its CQ's owner polls (plain loads on x86).
  std::atomic<QpState> state_{QpState::kConnected};
  mutable std::mutex post_mutex_;  // only when options.thread_safe
};

inline void ShmQp::fill_recv_completion(const RecvSlot& slot, const PostedRecv& posted,
                                        Completion* c) const noexcept {
  // Every field was written by the peer: each is read once (the peer may
  // change it meanwhile) and checked against our own record before it is
  // used or reported. A lie fails this completion.
  auto status = static_cast<Status>(read_once(slot.status));
  const uint32_t byte_len = read_once(slot.byte_len);
  auto opcode = static_cast<Opcode>(read_once(slot.opcode));
  const uint8_t where = read_once(slot.data_inline);
  if (opcode != Opcode::kRecv && opcode != Opcode::kRecvWriteWithImm) {
    opcode = Opcode::kRecv;
    status = Status::kLocalQpOperationError;
  }
  if (status != Status::kSuccess && status != Status::kLocalLengthError &&
      status != Status::kLocalProtectionError && status != Status::kWrFlushError) {
    status = Status::kLocalQpOperationError;
  }
  if (status == Status::kSuccess && opcode == Opcode::kRecv) {
    if (byte_len > posted.length) {
      status = Status::kLocalQpOperationError;
    } else if (where == kPayloadInSlot) {
      if (byte_len <= kSlotInline) {
        detail::small_copy<kSlotInline>(posted.addr, slot.data, byte_len);
      } else {
        status = Status::kLocalQpOperationError;
      }
    } else if (where == kPayloadOnSocket) {
      status = take_socket_payload(posted, byte_len);
    } else if (where != kPayloadInBuffer || (local_.payload_rx && byte_len != 0)) {
      // With a payload socket the peer never writes our buffers: a payload
      // said to be there is stale memory passed off as a message.
      status = Status::kLocalQpOperationError;
    }
  }
  c->wr_id = posted.wr_id;
  // A RECV never reports more than its buffer holds, even with an error.
  c->byte_len = opcode == Opcode::kRecv ? std::min(byte_len, posted.length) : byte_len;
  c->imm = read_once(slot.imm);
  c->qp_num = qp_num();
  c->opcode = opcode;
  c->status = status;
  c->flags = read_once(slot.flags) & kCompletionHasImm;
  c->reserved = 0;
  c->vendor_err = 0;
}

inline void ShmQp::take_recv(uint64_t index, Completion* c) noexcept {
  if (srq_ != nullptr) {
    take_srq_recv(index, c);
    return;
  }
  fill_recv_completion(local_.block->slots()[index], rq_[index], c);
}

inline int ShmQp::poll_recv(std::span<Completion> out) noexcept {
  size_t n = 0;
  while (n < out.size() && recv_done(std::memory_order_acquire)) {
    // A completed RECV was posted. Loading the posting thread's counter
    // orders our read of its record after that thread's writes in this
    // process too (the edge through the peer's mapping is invisible to TSan).
    static_cast<void>(rq_posted_.load(std::memory_order_acquire));
    Completion& c = out[n++];
    take_recv(rq_polled_ & rq_mask_, &c);
    ++rq_polled_;
    rq_polled_shared_.store(rq_polled_, std::memory_order_release);
    if (c.status != Status::kSuccess) enter_error();
  }
  if (state_ == QpState::kConnected) {
    // A poll that found completions leaves the liveness checks to the next.
    if (n != 0) return static_cast<int>(n);
    if (!peer_gone() &&
        local_.block->sender_state.load(std::memory_order_acquire) == kSideOpen) {
      return 0;
    }
  }
  return poll_recv_idle(out, n);
}

}  // namespace rdmakit::shm
