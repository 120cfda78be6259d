#include "table_layout.hpp"

// Inlined: a READ-GET's checks are on its latency path (a call into the
// shared library costs about as much as hashing a slot).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

namespace rdmakit::kv {
namespace {

void put_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
void put_u64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<std::byte> TableInfo::serialize() const {
  std::vector<std::byte> out(kSerializedSize);
  region.serialize(std::span<std::byte, RemoteRegion::kSerializedSize>(
      out.data(), RemoteRegion::kSerializedSize));
  std::byte* p = out.data() + RemoteRegion::kSerializedSize;
  put_u32(p, epoch);
  put_u64(p + 4, buckets);
  put_u64(p + 12, slot_count);
  put_u64(p + 20, block_count);
  put_u64(p + 28, blocks_offset);
  return out;
}

std::optional<TableInfo> TableInfo::deserialize(std::span<const std::byte> in) noexcept {
  if (in.size() < kSerializedSize) return std::nullopt;
  auto region = RemoteRegion::deserialize(in.first(RemoteRegion::kSerializedSize));
  if (!region) return std::nullopt;
  TableInfo t;
  t.region = *region;
  const std::byte* p = in.data() + RemoteRegion::kSerializedSize;
  t.epoch = get_u32(p);
  t.buckets = get_u64(p + 4);
  t.slot_count = get_u64(p + 12);
  t.block_count = get_u64(p + 20);
  t.blocks_offset = get_u64(p + 28);
  // A geometry that does not fit its region would send READs out of range.
  const bool pow2 = t.buckets != 0 && (t.buckets & (t.buckets - 1)) == 0;
  if (!pow2 || t.slot_count != t.buckets + kNeighborhood - 1 ||
      t.blocks_offset < kTableHeader + t.slot_count * kSlotSize ||
      t.blocks_offset + t.block_count * kBlockSize > t.region.length)
    return std::nullopt;
  return t;
}

uint64_t key_hash(std::string_view key) noexcept {
  return XXH3_64bits(key.data(), key.size());
}

namespace {

constexpr size_t kCheckCovered = offsetof(Slot, check) + sizeof(uint64_t);

// The check of a slot's bytes as they lie at raw (any alignment).
uint64_t raw_slot_check(const std::byte* raw, uint64_t version) noexcept {
  return XXH3_64bits_withSeed(raw + kCheckCovered, sizeof(Slot) - kCheckCovered, version);
}

// A slot's fields without its data, read in place from a snapshot.
struct SlotHead {
  uint64_t version;
  uint64_t check;
  uint64_t seq;
  uint64_t key_hash;
  uint32_t key_len;
  uint32_t value_len;
  uint32_t block;
  uint16_t state;
  uint16_t reach;
};
static_assert(sizeof(SlotHead) == kSlotHeader);

}  // namespace

uint64_t slot_check(const Slot& slot) noexcept {
  return raw_slot_check(reinterpret_cast<const std::byte*>(&slot), slot.version);
}

uint64_t block_check(const BlockHeader& header, const std::byte* payload) noexcept {
  return XXH3_64bits_withSeed(payload, size_t{header.key_len} + header.value_len,
                              header.seq);
}

ProbeResult probe_neighborhood(std::span<const std::byte> slots, std::string_view key,
                               uint64_t hash, std::string* value_out) {
  // Verified in place, with no copy of the slots: the snapshot is ours.
  ProbeResult best;
  const std::byte* best_data = nullptr;  // the data of the best inline hit
  size_t n = std::min<size_t>(kNeighborhood, slots.size() / kSlotSize);
  if (n == 0) return {Probe::kRetry};
  for (size_t i = 0; i < n; ++i) {
    const std::byte* raw = slots.data() + i * kSlotSize;
    // Only slots that may hold the key are verified. A slot whose key_hash
    // field differs from ours is skipped unchecked: a copy mixes bytes of
    // states of the slot, and if any of them held our key then either both
    // did (the key's bytes are the same in both, so the mix matches) or the
    // key is being inserted or deleted right now, when absent is a right
    // answer. A torn kMoved only costs a table refresh. The home slot is
    // always verified: its reach says how far the key can be.
    SlotHead s;
    std::memcpy(&s, raw, sizeof s);
    if (i != 0 && s.key_hash != hash && s.state != uint16_t(SlotState::kMoved)) continue;
    if ((s.version & 1) != 0 || s.check != raw_slot_check(raw, s.version))
      return {Probe::kRetry};
    const auto state = static_cast<SlotState>(s.state);
    if (state == SlotState::kMoved) return {Probe::kMoved};
    if (i == 0) {
      if (s.reach > kNeighborhood) return {Probe::kRetry};  // never in a checked slot
      if (s.reach > n) {
        ProbeResult more{Probe::kMore};
        more.reach = s.reach;
        return more;
      }
      n = s.reach;  // no key of this bucket lies further
      if (n == 0) return best;
    }
    if (s.key_hash != hash) continue;  // the home slot holds another bucket's key
    if (state == SlotState::kEmpty || s.key_len != key.size()) continue;
    const std::byte* data = raw + kSlotHeader;
    if (state == SlotState::kInline) {
      if (s.key_len + size_t{s.value_len} > kInlineBytes) return {Probe::kRetry};
      if (std::memcmp(data, key.data(), key.size()) != 0) continue;
    } else if (state != SlotState::kIndirect) {
      return {Probe::kRetry};
    }
    // The neighborhood is not copied atomically: a key deleted from one slot
    // and put again into another may show up twice. The later PUT wins.
    if (best.probe != Probe::kAbsent && s.seq <= best.seq) continue;
    best.probe = state == SlotState::kInline ? Probe::kFound : Probe::kIndirect;
    best.seq = s.seq;
    best.block = s.block;
    best.value_len = s.value_len;
    best_data = state == SlotState::kInline ? data : nullptr;
  }
  if (best_data != nullptr && value_out != nullptr) {
    value_out->assign(reinterpret_cast<const char*>(best_data) + key.size(),
                      best.value_len);
  }
  return best;
}

bool verify_block(std::span<const std::byte> block, std::string_view key, uint64_t seq,
                  std::string* value_out) {
  if (block.size() < kBlockHeader) return false;
  BlockHeader h;
  std::memcpy(&h, block.data(), kBlockHeader);
  if (h.seq != seq || h.key_len != key.size() || h.value_len > kMaxValue ||
      block.size() < kBlockHeader + h.key_len + size_t{h.value_len})
    return false;
  const std::byte* payload = block.data() + kBlockHeader;
  if (h.check != block_check(h, payload)) return false;
  if (std::memcmp(payload, key.data(), key.size()) != 0) return false;
  if (value_out != nullptr)
    value_out->assign(reinterpret_cast<const char*>(payload) + key.size(), h.value_len);
  return true;
}

}  // namespace rdmakit::kv
