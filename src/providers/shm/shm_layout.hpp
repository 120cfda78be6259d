#pragma once
// Structures that live in shared memory and are read or written by two
// processes. Every cross-process field is a lock-free atomic or is published
// by a release store of a counter and read after its acquire load.
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "rdmakit/detail/hello_frame.hpp"

namespace rdmakit::shm {

inline constexpr uint32_t kRegionIndexBits = 12;
inline constexpr uint32_t kRegionTableSize = 1u << kRegionIndexBits;
inline constexpr uint32_t kRegionIndexMask = kRegionTableSize - 1;
inline constexpr uint32_t kLayoutMagic = 0x52444b53;  // "RDKS"
// 4: identity from SO_PEERCRED (no pid in the Hello), payload sockets.
inline constexpr uint16_t kProtocolVersion = 4;

// One load of a plain field a peer may be rewriting at any time: the
// compiler neither repeats it (a check and a use would see two values) nor
// elides it.
template <class T>
inline T read_once(const T& field) noexcept {
  return *static_cast<const volatile T*>(&field);
}

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "cross-process atomics must not fall back to locks");
static_assert(std::atomic<uint32_t>::is_always_lock_free);

enum class RegionKind : uint32_t {
  kMemfd = 1,  // allocate(): peers map the memfd and access it directly
  kUser = 2,   // register_memory(): peers use process_vm_readv/writev
};

// One registered region of a context. rkey == lkey == key: (generation <<
// kRegionIndexBits) | index, never 0. Readers use the key as a sequence lock:
// load key, read fields, fence, load key again; equal keys mean a consistent
// snapshot of a live region.
struct RegionEntry {
  std::atomic<uint32_t> key{0};
  std::atomic<uint32_t> access{0};
  std::atomic<uint32_t> kind{0};
  uint32_t reserved = 0;
  std::atomic<uint64_t> addr{0};  // in the owner's address space
  std::atomic<uint64_t> length{0};
};
static_assert(sizeof(RegionEntry) == 32);

struct RegionTable {
  uint32_t magic = kLayoutMagic;
  uint32_t reserved32 = 0;
  uint64_t reserved[7] = {};
  RegionEntry entries[kRegionTableSize];
};

// Snapshot of a live region entry (read_entry), or false if key does not
// name one.
struct EntryView {
  uint32_t access;
  RegionKind kind;
  uint64_t addr;
  uint64_t length;
};

inline bool read_entry(const RegionTable& table, uint32_t key, EntryView* view) noexcept {
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

inline bool in_range(const EntryView& view, uint64_t addr, uint64_t length) noexcept {
  return addr >= view.addr && length <= view.length &&
         addr - view.addr <= view.length - length;
}

// Receive queue entry: one cache line, so a small SEND moves one line from
// sender to receiver, like a cache-line ping-pong. The receiver fills
// addr/length/lkey and then publishes post_seq = n+1 (release) for the n-th
// RECV; the sender fills the result (and, for payloads of at most
// kSlotInline bytes, the data itself) and publishes done_seq = n+1. The
// receiver copies inline data into its buffer when it polls the completion.
//
// A QP on a shared receive queue keeps this ring for its completions only:
// post_seq is a credit the receiver renews as it polls, the buffer comes from
// the SRQ, and the sender records the SRQ entry it claimed in srq_entry.
inline constexpr uint32_t kSlotInline = 20;  // <= detail::kSmallCopyMax (small_copy.hpp)
// done_seq = (n+1) | kSlotFilling: a sender is writing a payload straight
// into the buffer of RECV n. A receiver entering the error state does not
// flush that RECV until the sender published it (or died).
inline constexpr uint64_t kSlotFilling = uint64_t{1} << 63;
// RecvSlot::data_inline: where a successful SEND's payload is.
inline constexpr uint8_t kPayloadInBuffer = 0;  // written into the RECV buffer
inline constexpr uint8_t kPayloadInSlot = 1;    // in slot.data
inline constexpr uint8_t kPayloadOnSocket = 2;  // next message on the payload socket

struct alignas(64) RecvSlot {
  std::atomic<uint64_t> post_seq{0};  // receiver writes
  std::atomic<uint64_t> done_seq{0};  // sender writes
  union {
    uint64_t addr = 0;   // own receive queue: buffer address
    uint64_t srq_entry;  // SRQ: claimed entry + 1, 0 = none (atomic_ref access)
  };
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint32_t byte_len = 0;
  uint32_t imm = 0;
  uint8_t status = 0;  // rdmakit::Status
  uint8_t opcode = 0;  // rdmakit::Opcode of the completion
  uint8_t flags = 0;   // CompletionFlags
  uint8_t data_inline = 0;
  std::byte data[kSlotInline] = {};
};
static_assert(sizeof(RecvSlot) == 64, "one receive slot per cache line");

// A shared receive queue, created by its owner and mapped by the senders of
// every QP attached to it. A posted RECV occupies a buffer entry until its
// completion is polled; the order of posting is a ring of entry indices. The
// owner publishes the n-th RECV in ring[n % ring_size] (post_seq = n+1); a
// sender consumes the oldest one by advancing `claimed` with a
// compare-and-swap, so RECVs are taken in posted order whichever QP's message
// comes first. Entries complete in any order (several QPs consume them), so a
// ring slot is free again once claimed and an entry once its completion was
// polled; ring and entries have room for twice max_wr.
struct SrqRingSlot {
  std::atomic<uint64_t> post_seq{0};  // owner writes
  std::atomic<uint32_t> entry{0};     // buffer entry of this RECV
  uint32_t reserved = 0;
};
static_assert(sizeof(SrqRingSlot) == 16);

struct SrqEntry {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};
static_assert(sizeof(SrqEntry) == 16);

struct alignas(64) SrqBlock {
  uint32_t magic = kLayoutMagic;
  uint32_t ring_size = 0;                        // power of two; also the entry count
  alignas(64) std::atomic<uint64_t> claimed{0};  // senders advance (CAS)

  SrqRingSlot* ring() noexcept { return reinterpret_cast<SrqRingSlot*>(this + 1); }
  SrqEntry* entries() noexcept { return reinterpret_cast<SrqEntry*>(ring() + ring_size); }
  static size_t bytes_for(uint32_t ring_size) noexcept {
    return sizeof(SrqBlock) + (sizeof(SrqRingSlot) + sizeof(SrqEntry)) * ring_size;
  }
};
static_assert(sizeof(SrqBlock) % 64 == 0);

enum QpSideState : uint32_t { kSideOpen = 0, kSideError = 1, kSideClosed = 2 };

// One per QP per side, created by the receiving side and mapped by its peer:
// the receive ring the peer's SENDs consume, and the wake-up handshake.
struct alignas(64) InboundBlock {
  uint32_t magic = kLayoutMagic;
  uint32_t ring_size = 0;                                    // power of two
  alignas(64) std::atomic<uint32_t> owner_state{kSideOpen};  // receiver writes
  std::atomic<uint32_t> cq_armed{0};  // receiver's CQ sleeps: sender must signal
  alignas(64) std::atomic<uint32_t> sender_state{kSideOpen};  // sender writes

  RecvSlot* slots() noexcept { return reinterpret_cast<RecvSlot*>(this + 1); }
  static size_t bytes_for(uint32_t ring_size) noexcept {
    return sizeof(InboundBlock) + sizeof(RecvSlot) * ring_size;
  }
};
static_assert(sizeof(InboundBlock) % 64 == 0, "slots start on a cache line");

// Control messages on the per-QP request socket (SOCK_SEQPACKET).
enum class RequestOp : uint32_t { kGetRegion = 1, kCompareSwap = 2, kFetchAdd = 3 };

struct Request {
  RequestOp op;
  uint32_t rkey;
  uint64_t addr;
  uint64_t compare_add;
  uint64_t swap;
};

struct Reply {
  uint32_t status;  // rdmakit::Status
  uint32_t writable;
  uint64_t value;  // atomics: the old value
};

// Connection handshake: each side sends one Hello plus four descriptors:
// region table, inbound block, recv CQ eventfd, request socket for the peer;
// then the SRQ block when srq_ring_size != 0, then the sending end of our
// payload socket when payload_socket != 0. A refusal carries no descriptor.
// Who the peer is (pid, uid) comes from SO_PEERCRED, never from here.
enum class RejectReason : uint32_t { kNone = 0, kRejected = 1, kUserNotAdmitted = 2 };
struct Hello {
  uint32_t magic = kLayoutMagic;
  uint16_t version = kProtocolVersion;
  uint16_t private_len = 0;
  uint32_t reject_reason = 0;  // RejectReason, with accepted == 0
  uint32_t ring_size = 0;
  uint32_t qp_num = 0;
  uint32_t accepted = 1;       // reply only: 0 = rejected
  uint32_t srq_ring_size = 0;  // receives through a shared receive queue
  // The sender's CQs issue heavy_fence() when they arm, so our sends may
  // publish completions with a release store (see shm_asymmetric_fence.hpp).
  uint32_t fence_on_arm = 0;
  // SEND payloads larger than a slot go through a socket we read at poll
  // time, not into our buffers (a peer of another user, or Yama).
  uint32_t payload_socket = 0;
  uint8_t private_data[192] = {};
};
// A host struct, sent whole over a SEQPACKET socket: exactly its size.
inline constexpr detail::HelloFrame<uint16_t, std::endian::native> kHelloFrame{
    kLayoutMagic, kProtocolVersion, sizeof(Hello), detail::HelloSize::kExactly};
inline constexpr size_t kHelloFds = 4;
inline constexpr size_t kHelloMaxFds = 6;

}  // namespace rdmakit::shm
