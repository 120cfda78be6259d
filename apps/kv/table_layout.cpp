#include "table_layout.hpp"

// Inlined: a READ-GET's checks are on its latency path (a call into the
// shared library costs about as much as hashing a slot).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
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
  // A geometry that does not fit its region would send READs out of range;
  // one too large would have the client allocate per bucket without bound.
  // Every product below is checked before it is formed.
  const bool pow2 = t.buckets != 0 && (t.buckets & (t.buckets - 1)) == 0;
  if (!pow2 || t.buckets > kMaxDescribedBuckets ||
      t.slot_count != t.buckets + kNeighborhood - 1 ||
      t.blocks_offset < kTableHeader + t.slot_count * kSlotSize ||
      t.blocks_offset > t.region.length ||
      t.block_count > (t.region.length - t.blocks_offset) / kBlockSize)
    return std::nullopt;
  return t;
}

uint64_t key_hash(std::string_view key) noexcept {
  return XXH3_64bits(key.data(), key.size());
}

namespace {

constexpr size_t kCheckCovered = offsetof(Slot, check) + sizeof(uint64_t);
constexpr size_t kHeadCovered = kSlotHeader - kCheckCovered;  // seq .. reach

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

// The bytes after the check field that the check covers: the rest of the
// header, and for an inline entry its key and value; the data bytes past them
// are never read, so they need no check (a short entry hashes ~50 B, not 112).
// The lengths are part of what is covered, so a copy whose lengths come from
// one state and whose covered bytes are not all that state's is still a mix
// the check rejects. nullopt: lengths no sealed slot has.
std::optional<size_t> covered_bytes(const SlotHead& s) noexcept {
  if (s.state != uint16_t(SlotState::kInline)) return kHeadCovered;
  const uint64_t data = uint64_t{s.key_len} + s.value_len;
  if (data > kInlineBytes) return std::nullopt;
  return kHeadCovered + data;
}

// The check of a slot's bytes as they lie at raw (any alignment). The reader
// calls xxh3's 17..128-byte routine directly, which is what
// XXH3_64bits_withSeed runs for these lengths: the general entry inlines every
// length class into the READ-GET's path, with spills that cost more than the
// hash (kv_table_test checks that both give the same check).
static_assert(kHeadCovered >= 17 && kHeadCovered + kInlineBytes <= 128);
uint64_t raw_slot_check(const std::byte* raw, uint64_t version, size_t covered) noexcept {
  return XXH3_len_17to128_64b(reinterpret_cast<const xxh_u8*>(raw + kCheckCovered),
                              covered, XXH3_kSecret, sizeof(XXH3_kSecret), version);
}

template <class T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A snapshot of a slot that may hold our key is trusted only if its version is
// even and its check matches.
bool sealed(const std::byte* raw, const SlotHead& s) noexcept {
  if ((s.version & 1) != 0) return false;
  const std::optional<size_t> covered = covered_bytes(s);
  return covered && s.check == raw_slot_check(raw, s.version, *covered);
}

}  // namespace

uint64_t slot_check(const Slot& slot) noexcept {
  SlotHead s;
  std::memcpy(&s, &slot, sizeof s);
  // The server never seals an inline entry longer than the slot's data; if it
  // did, the whole slot would be covered and no reader would accept it.
  const size_t covered = covered_bytes(s).value_or(sizeof(Slot) - kCheckCovered);
  return XXH3_64bits_withSeed(reinterpret_cast<const std::byte*>(&slot) + kCheckCovered,
                              covered, s.version);
}

uint64_t block_check(const BlockHeader& header, const std::byte* payload) noexcept {
  return XXH3_64bits_withSeed(payload, size_t{header.key_len} + header.value_len,
                              header.seq);
}

ProbeResult probe_neighborhood(std::span<const std::byte> slots, std::string_view key,
                               uint64_t hash, std::string* value_out) {
  // Verified in place, with no copy of the slots: the snapshot is ours.
  const size_t have = std::min<size_t>(kNeighborhood, slots.size() / kSlotSize);
  if (have == 0) return {Probe::kRetry};
  // The home slot's reach and state are used without its check. Each is a
  // small number (reach <= kNeighborhood, state <= 3) whose high byte is zero
  // in every state the server ever stores, so a copy, which takes each byte
  // whole from some state, shows a value the field really had, never a blend.
  // And neither goes back within a table: reach only grows, and raises before
  // the reply of the PUT that needs it; kMoved is final. So a READ issued after
  // a PUT's reply sees that PUT's reach or a larger one, and a `moved` state
  // means the table is retired. What is checked is the entry a hit is taken
  // from, below.
  const auto reach = load<uint16_t>(slots.data() + offsetof(Slot, reach));
  if (load<uint16_t>(slots.data() + offsetof(Slot, state)) == uint16_t(SlotState::kMoved))
    return {Probe::kMoved};
  if (reach > kNeighborhood) return {Probe::kRetry};  // never stored
  if (reach > have) {
    ProbeResult more{Probe::kMore};
    more.reach = reach;
    return more;
  }
  ProbeResult best;
  best.reach = reach;
  const std::byte* best_data = nullptr;  // the data of the best inline hit
  for (size_t i = 0; i < reach; ++i) {
    const std::byte* raw = slots.data() + i * kSlotSize;
    // Fields are loaded from the snapshot where they lie, the whole header
    // only for a slot that may hold the key.
    const auto state = load<uint16_t>(raw + offsetof(Slot, state));
    if (state == uint16_t(SlotState::kMoved)) return {Probe::kMoved};  // final too
    if (load<uint64_t>(raw + offsetof(Slot, key_hash)) != hash) continue;
    SlotHead s;
    std::memcpy(&s, raw, sizeof s);
    // Only slots that may hold the key are verified. A slot whose key_hash,
    // key length or state says it does not is skipped unchecked: a copy mixes
    // bytes of states of the slot, and if any of them held our key then
    // either all did (the key's fields are the same in each, so they match)
    // or the key is being inserted or deleted right now, when absent is a
    // right answer.
    if (s.key_hash != hash || s.key_len != key.size()) continue;
    const bool is_inline = s.state == uint16_t(SlotState::kInline);
    if (!is_inline && s.state != uint16_t(SlotState::kIndirect)) continue;
    if (!sealed(raw, s)) return {Probe::kRetry};
    const std::byte* data = raw + kSlotHeader;
    if (is_inline && std::memcmp(data, key.data(), key.size()) != 0) continue;
    // The neighborhood is not copied atomically: a key deleted from one slot
    // and put again into another may show up twice. The later PUT wins.
    if (best.probe != Probe::kAbsent && s.seq <= best.seq) continue;
    best.probe = is_inline ? Probe::kFound : Probe::kIndirect;
    best.seq = s.seq;
    best.block = s.block;
    best.value_len = s.value_len;
    best_data = is_inline ? data : nullptr;
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
