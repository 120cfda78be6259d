#pragma once
// The kv table as it lies in the server's registered region, read by clients
// with one-sided READs (docs/kv.md has the picture).
//
//   [TableHeader 64 B][slot 0 .. slot_count-1, 128 B each][block 0 .. block_count-1]
//
// A key hashes (xxh3) to a home bucket b; it lives in one of the kNeighborhood
// slots b .. b+kNeighborhood-1 (slot_count = buckets + kNeighborhood - 1, so a
// neighborhood never wraps). A READ-GET reads that neighborhood in one READ.
// Key + value up to kInlineBytes live in the slot; longer ones live in a
// block (second READ) that the slot names.
//
// Every slot and block is self-verifying: a slot's check is xxh3 over the
// header bytes after the check field and, for an inline entry, its key and
// value (not the unused rest of the data), seeded with its version (odd while
// the server writes it); a block's check is xxh3 over its key and value,
// seeded with the slot's seq. A READ is a copy the server does not take part in (a NIC's
// DMA, shm's memcpy from the mapping, tcp's send(2) from the region), in any byte order
// and racing the server's stores, so the reader trusts only a snapshot whose
// check matches; anything else is retried.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::kv {

inline constexpr size_t kMaxKey = 256;
inline constexpr size_t kMaxValue = 64 * 1024;
inline constexpr uint32_t kNeighborhood = 16;
inline constexpr size_t kSlotSize = 128;
inline constexpr size_t kSlotHeader = 48;
inline constexpr size_t kInlineBytes = kSlotSize - kSlotHeader;  // key + value
inline constexpr size_t kBlockHeader = 32;
inline constexpr size_t kBlockSize = 65856;  // header + kMaxKey + kMaxValue, 64-aligned
inline constexpr size_t kTableHeader = 64;
// The largest table a descriptor may describe (the server grows to 2^21
// buckets by default): a client keeps a byte per bucket, and the geometry's
// products stay far from overflow.
inline constexpr uint64_t kMaxDescribedBuckets = uint64_t{1} << 26;
inline constexpr uint64_t kTableMagic = 0x314c4254564b5452ull;  // "RTKVTBL1"
inline constexpr uint32_t kNoBlock = 0xffffffffu;
// A READ-GET first copies this many slots from the key's home bucket (512 B):
// enough for every key of the bucket unless the home slot's reach says more,
// when a second READ copies the rest (rare at the table's half load).
inline constexpr uint32_t kFirstReadSlots = 4;
static_assert(kBlockSize >= kBlockHeader + kMaxKey + kMaxValue && kBlockSize % 64 == 0);

enum class SlotState : uint16_t {
  kEmpty = 0,
  kInline = 1,    // key and value in data[]
  kIndirect = 2,  // key and value in block `block`
  kMoved = 3,     // this table is retired: fetch the current one (new epoch)
};

struct Slot {
  uint64_t version;  // seqlock: odd while the server writes the slot
  uint64_t check;    // xxh3(header after this field + key + value, seed = version)
  uint64_t seq;      // server-wide write counter at the PUT; newer wins
  uint64_t key_hash;
  uint32_t key_len;
  uint32_t value_len;
  uint32_t block;
  uint16_t state;  // SlotState
  // A property of the bucket this slot is the home of, not of the entry in
  // it: every key whose home bucket this is lies in this slot or the next
  // reach-1 (0: none). Only grows within a table (a delete leaves it), so a
  // reader that copied this slot knows how many slots it must look at.
  uint16_t reach;
  std::byte data[kInlineBytes];
};
static_assert(sizeof(Slot) == kSlotSize && offsetof(Slot, data) == kSlotHeader);

struct BlockHeader {
  uint64_t seq;    // the seq of the slot that names this block
  uint64_t check;  // xxh3(key || value, seed = seq)
  uint32_t key_len;
  uint32_t value_len;
  uint64_t reserved;
};
static_assert(sizeof(BlockHeader) == kBlockHeader);

struct TableHeader {
  uint64_t magic;
  uint32_t epoch;
  uint32_t retired;  // 1 once a newer table replaced this one
  uint64_t buckets;  // power of two
  uint64_t slot_count;
  uint64_t block_count;
  uint64_t blocks_offset;
  uint64_t reserved[2];
};
static_assert(sizeof(TableHeader) == kTableHeader);

// What a client needs to READ a table: the region and its geometry. Sent in
// the accept reply and in the TABLE reply (fixed 64 B, little-endian).
struct TableInfo {
  RemoteRegion region;
  uint32_t epoch = 0;
  uint64_t buckets = 0;
  uint64_t slot_count = 0;
  uint64_t block_count = 0;
  uint64_t blocks_offset = 0;

  static constexpr size_t kSerializedSize = RemoteRegion::kSerializedSize + 36;
  std::vector<std::byte> serialize() const;
  static std::optional<TableInfo> deserialize(std::span<const std::byte> in) noexcept;

  uint64_t home_bucket(uint64_t key_hash) const noexcept {
    return key_hash & (buckets - 1);
  }
  uint64_t slot_offset(uint64_t slot) const noexcept {
    return kTableHeader + slot * kSlotSize;
  }
  uint64_t block_offset(uint32_t block) const noexcept {
    return blocks_offset + uint64_t{block} * kBlockSize;
  }
};

uint64_t key_hash(std::string_view key) noexcept;
uint64_t slot_check(const Slot& slot) noexcept;
uint64_t block_check(const BlockHeader& header, const std::byte* payload) noexcept;

// Reader side: what a snapshot of a neighborhood says about a key.
enum class Probe {
  kFound,     // inline hit: value_out holds the value
  kIndirect,  // hit in a block: READ it (block_out, seq_out) and call verify_block
  kAbsent,
  kRetry,  // a slot of the neighborhood was being written: READ again
  kMoved,  // the table was replaced: fetch the new one
  kMore,   // the home slot's reach goes past the slots given: READ up to `reach`
};
struct ProbeResult {
  Probe probe = Probe::kAbsent;
  uint32_t block = kNoBlock;
  uint64_t seq = 0;
  uint32_t value_len = 0;
  // The home slot's reach: for kMore the slots to copy from the home bucket;
  // otherwise what the client remembers to size its next READ of the bucket.
  uint32_t reach = 0;
};
// slots: 1..kNeighborhood slots copied from the table starting at the key's
// home bucket, in any alignment. The home slot's reach bounds the search
// (kMore if the copy is shorter); only the slots that may hold the key are
// verified (table_layout.cpp says why the reach needs no check).
ProbeResult probe_neighborhood(std::span<const std::byte> slots, std::string_view key,
                               uint64_t hash, std::string* value_out);
inline ProbeResult probe_neighborhood(std::span<const std::byte> slots,
                                      std::string_view key, std::string* value_out) {
  return probe_neighborhood(slots, key, key_hash(key), value_out);
}
// block: kBlockHeader + key + value bytes copied from the block. True if it is
// exactly the entry the slot (seq) named, for this key; the value goes out.
bool verify_block(std::span<const std::byte> block, std::string_view key, uint64_t seq,
                  std::string* value_out);

}  // namespace rdmakit::kv
