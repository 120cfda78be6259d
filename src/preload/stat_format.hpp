#pragma once
// Layout of the statistics file each preloaded process publishes
// (docs/stat.md): /dev/shm/rdmakit-stat-<uid>-<pid>, mode 0600, a fixed
// header followed by a fixed array of connection slots. Written by the
// preload library (src/preload/stat.cpp), read by rdmakit-stat
// (tools/rdmakit-stat), which treats it as hostile input: every count and
// size below is checked against these constants and the file's size before
// use, and every string is cut at its array's end.
//
// Concurrency: the counters are relaxed atomics, each written by the thread
// doing the I/O (a load and a store: no locked instruction on the data
// path). A slot's fixed fields are written between `gen` and `gen_end`
// while `state` is kBusy; a reader keeps a slot only when state is kLive or
// kClosed and gen == gen_end.
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmakit::preload::stats {

inline constexpr char kMagic[8] = {'R', 'K', 'S', 'T', 'A', 'T', '1', '\0'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kSlotCount = 1024;  // connections listed per process
inline constexpr uint32_t kReasonCount = 16;  // distinct fallback reasons counted
inline constexpr size_t kHeaderSize = 4096;
inline constexpr size_t kAddrLen = 48;
inline constexpr size_t kSlotReasonLen = 112;
inline constexpr size_t kReasonLen = 120;
inline constexpr size_t kProgramLen = 32;
inline constexpr const char* kDefaultDir = "/dev/shm";
inline constexpr const char* kFilePrefix = "rdmakit-stat-";

enum Path : uint8_t {
  kPathNone = 0,
  kPathShm = 1,
  kPathVerbs = 2,
  kPathTcp = 3,
  kPathKernel = 4
};
enum Side : uint8_t { kSideNone = 0, kSideConnect = 1, kSideAccept = 2 };
enum State : uint32_t { kEmpty = 0, kBusy = 1, kLive = 2, kClosed = 3 };

// One relaxed counter with a single writer per direction: load + store.
inline void bump(std::atomic<uint64_t>& a, uint64_t n) noexcept {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct alignas(64) Slot {
  std::atomic<uint32_t> state;  // State
  uint32_t gen;                 // bumped when claimed
  int32_t fd;
  uint8_t path;     // Path
  uint8_t side;     // Side
  uint8_t counted;  // 1: the byte counters below are kept (not for kPathKernel)
  uint8_t pad0;
  uint64_t opened_ns;  // CLOCK_MONOTONIC
  std::atomic<uint64_t> closed_ns;
  uint32_t ring_bytes;  // each receive ring and send buffer
  uint32_t gen_end;     // == gen once the fixed fields are whole
  char local[kAddrLen];
  char peer[kAddrLen];
  char reason[kSlotReasonLen];  // kPathKernel: why
  // Counters, on their own cache line (written by the I/O hooks).
  alignas(64) std::atomic<uint64_t> tx_bytes;
  std::atomic<uint64_t> tx_msgs;  // successful send calls (each mmsg message counts)
  std::atomic<uint64_t> rx_bytes;
  std::atomic<uint64_t> rx_msgs;  // successful receive calls (no MSG_PEEK)
  std::atomic<uint64_t> rx_peak;  // most bytes one read took from the ring
};
static_assert(sizeof(Slot) == 320);

struct ReasonCount {
  std::atomic<uint64_t> count;
  char text[kReasonLen];
};

struct HeaderFields {
  char magic[8];  // kMagic, written last by the publisher
  uint32_t version;
  uint32_t header_size;  // kHeaderSize
  uint32_t slot_size;    // sizeof(Slot)
  uint32_t slot_count;   // kSlotCount
  int32_t pid;
  uint32_t reason_count;  // kReasonCount
  uint64_t start_ticks;   // field 22 of /proc/PID/stat: tells a reused pid apart
  char program[kProgramLen];
  std::atomic<uint64_t> upgrades_shm;
  std::atomic<uint64_t> upgrades_remote;
  std::atomic<uint64_t> fallbacks;
  std::atomic<uint64_t> unlisted;  // decisions with no free slot
  // Totals of the connections closed so far (their slots may be reused).
  std::atomic<uint64_t> closed_tx_bytes;
  std::atomic<uint64_t> closed_rx_bytes;
  std::atomic<uint64_t> closed_tx_msgs;
  std::atomic<uint64_t> closed_rx_msgs;
  std::atomic<uint64_t> reasons_other;  // fallbacks whose reason found no entry
  ReasonCount reasons[kReasonCount];
};

struct Header : HeaderFields {
  char pad[kHeaderSize - sizeof(HeaderFields)];
};
static_assert(sizeof(Header) == kHeaderSize);

inline constexpr size_t kFileSize = kHeaderSize + sizeof(Slot) * kSlotCount;

}  // namespace rdmakit::preload::stats
