#include "table.hpp"

#include <atomic>
#include <bit>
#include <cstring>

#include "fmt/format.h"
#include "rdmakit/detail/tsan.hpp"

// Under TSan: the table's bytes are read by peers outside the C++ memory model
// (a NIC's DMA; on tcp, send(2) from the provider's progress thread), checked
// by the entry checksums rather than ordered by atomics, so the server's table
// stores are not recorded as racing those reads.
#ifdef RDMAKIT_TSAN
#define KV_PUBLISH_BEGIN() AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define KV_PUBLISH_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#else
#define KV_PUBLISH_BEGIN() ((void)0)
#define KV_PUBLISH_END() ((void)0)
#endif

namespace rdmakit::kv {
namespace {

// Publishes `next` (check already computed for next.version, which is even)
// into the table slot `dst`.
//
// Memory ordering. A reader's copy has no order at all: a NIC's DMA, shm's
// memcpy from the mapping and tcp's send(2) may read the slot's bytes in any
// order and interleaved with these stores. So the odd version is only a hint
// that makes most racing readers fail fast; what makes a torn copy impossible
// to accept is the check: it covers every byte after it and is seeded with the
// even version, so a copy mixing bytes of two states (or of a state half
// written) matches neither state's check (xxh3, 2^-64). Staleness is ruled out
// by order on this side only: every store of a PUT is done before the server
// posts the PUT's reply (program order; the provider publishes the SEND with a
// release store or a syscall, verbs rings the doorbell after a write barrier),
// so a READ the client issues after it saw the reply cannot copy older bytes.
void publish_slot(Slot* dst, const Slot& next) {
  std::atomic_ref<uint64_t> version(dst->version);
  KV_PUBLISH_BEGIN();
  version.store(next.version - 1, std::memory_order_relaxed);
  // Keeps the compiler from sinking the odd version below the content stores.
  // x86 keeps stores in order; a weakly ordered CPU may show the odd version
  // late, which only means a racing reader is caught by the check instead.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(reinterpret_cast<std::byte*>(dst) + sizeof(uint64_t),
              reinterpret_cast<const std::byte*>(&next) + sizeof(uint64_t),
              sizeof(Slot) - sizeof(uint64_t));
  version.store(next.version, std::memory_order_release);
  KV_PUBLISH_END();
}

Slot next_slot(const Slot& current) {
  Slot s{};
  s.version = (current.version | 1) + 1;  // next even version
  s.block = kNoBlock;
  // The bucket's, whatever entry the slot holds (never beyond the neighborhood).
  s.reach = std::min<uint16_t>(current.reach, kNeighborhood);
  return s;
}

void seal(Slot& s) { s.check = slot_check(s); }

// The table's memory is shared: peers READ it and, should a provider or a
// peer with more access than granted ever write it, its lengths would be
// lies. So the server copies a slot out before it uses it, and uses an entry
// only if every length and index in that copy is one the server could have
// stored (the copy, not the shared bytes, is what is checked and then used).
bool entry_in_bounds(const Slot& s, const TableInfo& t) noexcept {
  if (s.key_len == 0 || s.key_len > kMaxKey || s.value_len > kMaxValue) return false;
  if (s.state == uint16_t(SlotState::kInline))
    return size_t{s.key_len} + s.value_len <= kInlineBytes;
  if (s.state == uint16_t(SlotState::kIndirect)) return s.block < t.block_count;
  return false;
}

uint64_t round_pow2(uint64_t v) { return std::bit_ceil(std::max<uint64_t>(v, 16)); }

}  // namespace

Table::Table(Context& ctx, const TableOptions& options) : ctx_(ctx), options_(options) {
  const uint64_t buckets =
      std::min(round_pow2(options.capacity * 2), options.max_buckets);
  current_ = make_generation(buckets, std::max<uint64_t>(options.blocks, 1), 1);
}

Table::~Table() = default;

Table::Generation Table::make_generation(uint64_t buckets, uint64_t blocks,
                                         uint32_t epoch) {
  Generation g;
  TableInfo& t = g.info;
  t.epoch = epoch;
  t.buckets = buckets;
  t.slot_count = buckets + kNeighborhood - 1;
  t.blocks_offset = (kTableHeader + t.slot_count * kSlotSize + 4095) / 4096 * 4096;
  t.block_count = blocks;
  const uint64_t bytes = t.blocks_offset + blocks * kBlockSize;
  g.mr = ctx_.allocate(bytes, kAccessLocalWrite | kAccessRemoteRead);
  t.region = g.mr->remote();
  // Every slot starts as a sealed empty entry, so a READ of a never-written
  // slot verifies like any other.
  Slot empty{};
  empty.version = 2;
  empty.block = kNoBlock;
  seal(empty);
  KV_PUBLISH_BEGIN();
  for (uint64_t i = 0; i < t.slot_count; ++i)
    std::memcpy(slot(g, i), &empty, sizeof empty);
  TableHeader h{};
  h.magic = kTableMagic;
  h.epoch = epoch;
  h.buckets = buckets;
  h.slot_count = t.slot_count;
  h.block_count = blocks;
  h.blocks_offset = t.blocks_offset;
  std::memcpy(g.mr->data(), &h, sizeof h);
  KV_PUBLISH_END();
  g.free_blocks.reserve(blocks);
  for (uint64_t b = blocks; b-- > 0;) g.free_blocks.push_back(static_cast<uint32_t>(b));
  return g;
}

uint32_t Table::indirect_block(const Generation& g, const Slot& shared) const noexcept {
  Slot s;
  std::memcpy(&s, &shared, sizeof s);
  // A block index out of range is never freed (nor used).
  return s.state == uint16_t(SlotState::kIndirect) && s.block < g.info.block_count
             ? s.block
             : kNoBlock;
}

Slot* Table::slot(const Generation& g, uint64_t index) const noexcept {
  return reinterpret_cast<Slot*>(g.mr->data() + g.info.slot_offset(index));
}

std::byte* Table::block(const Generation& g, uint32_t index) const noexcept {
  return g.mr->data() + g.info.block_offset(index);
}

bool Table::load_entry(const Generation& g, uint64_t index, Slot* out) const noexcept {
  std::memcpy(out, slot(g, index), sizeof *out);
  return entry_in_bounds(*out, g.info);
}

const std::byte* Table::entry_key(const Generation& g, const Slot& s) const noexcept {
  return s.state == uint16_t(SlotState::kInline) ? nullptr
                                                 : block(g, s.block) + kBlockHeader;
}

int64_t Table::find(const Generation& g, std::string_view key, uint64_t hash) const {
  const uint64_t home = g.info.home_bucket(hash);
  for (uint64_t i = home; i < home + kNeighborhood; ++i) {
    if (slot(g, i)->key_hash != hash) continue;
    Slot s;
    if (!load_entry(g, i, &s) || s.key_hash != hash || s.key_len != key.size()) continue;
    const std::byte* k =
        s.state == uint16_t(SlotState::kInline) ? s.data : entry_key(g, s);
    if (std::memcmp(k, key.data(), key.size()) == 0) return static_cast<int64_t>(i);
  }
  return -1;
}

PutOutcome Table::put_into(Generation& g, std::string_view key, std::string_view value,
                           uint64_t seq) {
  const uint64_t hash = key_hash(key);
  int64_t index = find(g, key, hash);
  const bool existing = index >= 0;
  if (!existing) {
    const uint64_t home = g.info.home_bucket(hash);
    for (uint64_t i = home; i < home + kNeighborhood && index < 0; ++i)
      if (slot(g, i)->state == uint16_t(SlotState::kEmpty))
        index = static_cast<int64_t>(i);
    if (index < 0) return PutOutcome::kFullNeighborhood;
  }
  Slot* dst = slot(g, static_cast<uint64_t>(index));
  const bool long_entry = key.size() + value.size() > kInlineBytes;
  if (long_entry && g.free_blocks.empty()) return PutOutcome::kFullBlocks;

  Slot next = next_slot(*dst);
  next.seq = seq;
  next.key_hash = hash;
  next.key_len = static_cast<uint32_t>(key.size());
  next.value_len = static_cast<uint32_t>(value.size());
  if (long_entry) {
    // A fresh block, never the one a reader may be copying for the old entry.
    next.block = g.free_blocks.back();
    g.free_blocks.pop_back();
    std::byte* b = block(g, next.block);
    BlockHeader h{};
    h.seq = seq;
    h.key_len = next.key_len;
    h.value_len = next.value_len;
    KV_PUBLISH_BEGIN();
    std::memcpy(b + kBlockHeader, key.data(), key.size());
    if (!value.empty())
      std::memcpy(b + kBlockHeader + key.size(), value.data(), value.size());
    h.check = block_check(h, b + kBlockHeader);
    std::memcpy(b, &h, sizeof h);
    KV_PUBLISH_END();
    next.state = uint16_t(SlotState::kIndirect);
  } else {
    std::memcpy(next.data, key.data(), key.size());
    if (!value.empty()) std::memcpy(next.data + key.size(), value.data(), value.size());
    next.state = uint16_t(SlotState::kInline);
  }
  const uint32_t old_block = existing ? indirect_block(g, *dst) : kNoBlock;
  const uint64_t home = g.info.home_bucket(hash);
  const auto reach = static_cast<uint16_t>(static_cast<uint64_t>(index) - home + 1);
  if (dst == slot(g, home) && next.reach < reach) next.reach = reach;
  seal(next);
  publish_slot(dst, next);
  // The entry first, then the reach that lets readers find it; both before
  // the reply, so a GET issued after it sees both.
  if (Slot* h = slot(g, home); h->reach < reach) {
    Slot widened;
    std::memcpy(&widened, h, sizeof widened);
    widened.version = (widened.version | 1) + 1;
    widened.reach = reach;
    seal(widened);
    publish_slot(h, widened);
  }
  // A reader still holding the old slot fails the block's seq check from here.
  if (old_block != kNoBlock) g.free_blocks.push_back(old_block);
  if (!existing) ++size_;
  return PutOutcome::kOk;
}

PutOutcome Table::put(std::string_view key, std::string_view value) {
  for (;;) {
    const PutOutcome r = put_into(current_, key, value, ++seq_);
    if (r == PutOutcome::kOk || !options_.grow) return r;
    const bool more_slots = r == PutOutcome::kFullNeighborhood;
    if (!grow(more_slots, !more_slots)) return r;
  }
}

bool Table::get(std::string_view key, std::string* value) const {
  const int64_t i = find(current_, key, key_hash(key));
  if (i < 0) return false;
  Slot s;
  if (!load_entry(current_, static_cast<uint64_t>(i), &s)) return false;
  const std::byte* v = s.state == uint16_t(SlotState::kInline)
                           ? s.data + s.key_len
                           : entry_key(current_, s) + s.key_len;
  value->assign(reinterpret_cast<const char*>(v), s.value_len);
  return true;
}

bool Table::erase(std::string_view key) {
  const int64_t i = find(current_, key, key_hash(key));
  if (i < 0) return false;
  Slot* dst = slot(current_, static_cast<uint64_t>(i));
  const uint32_t old_block = indirect_block(current_, *dst);
  Slot next = next_slot(*dst);
  next.seq = ++seq_;
  seal(next);
  publish_slot(dst, next);
  if (old_block != kNoBlock) current_.free_blocks.push_back(old_block);
  --size_;
  return true;
}

bool Table::grow(bool more_slots, bool more_blocks) {
  uint64_t buckets = current_.info.buckets * (more_slots ? 2 : 1);
  uint64_t blocks = current_.info.block_count * (more_blocks ? 2 : 1);
  for (;;) {
    if (buckets > options_.max_buckets || blocks > options_.max_blocks) return false;
    Generation g = make_generation(buckets, blocks, current_.info.epoch + 1);
    bool ok = true;
    std::string key;
    std::string value;
    for (uint64_t i = 0; i < current_.info.slot_count && ok; ++i) {
      Slot s;
      // Empty and moved slots, and entries no server could have stored.
      if (!load_entry(current_, i, &s)) continue;
      const std::byte* k =
          s.state == uint16_t(SlotState::kInline) ? s.data : entry_key(current_, s);
      key.assign(reinterpret_cast<const char*>(k), s.key_len);
      value.assign(reinterpret_cast<const char*>(k) + s.key_len, s.value_len);
      const PutOutcome r = put_into(g, key, value, s.seq);
      if (r == PutOutcome::kFullNeighborhood) {
        buckets *= 2;
        ok = false;
      } else if (r == PutOutcome::kFullBlocks) {
        blocks *= 2;
        ok = false;
      }
    }
    if (!ok) continue;
    retire(current_);
    retired_.push_back(std::move(current_.mr));
    current_ = std::move(g);
    return true;
  }
}

void Table::retire(Generation& g) {
  // Before the new table takes any write: a reader of the old one sees kMoved
  // (or the entries as they were, which are still current until then).
  for (uint64_t i = 0; i < g.info.slot_count; ++i) {
    Slot* dst = slot(g, i);
    Slot next = next_slot(*dst);
    next.state = uint16_t(SlotState::kMoved);
    seal(next);
    publish_slot(dst, next);
  }
  auto* h = reinterpret_cast<TableHeader*>(g.mr->data());
  KV_PUBLISH_BEGIN();
  std::atomic_ref<uint32_t>(h->retired).store(1, std::memory_order_release);
  KV_PUBLISH_END();
}

std::string Table::full_reason(PutOutcome outcome) const {
  const TableInfo& t = current_.info;
  if (outcome == PutOutcome::kFullBlocks)
    return fmt::format("table full: all {} long-entry blocks in use{}", t.block_count,
                       options_.grow ? "" : " (growth disabled)");
  return fmt::format(
      "table full: the key's {}-slot neighborhood is taken ({} keys, {} buckets{})",
      kNeighborhood, size_, t.buckets,
      options_.grow ? ", at the growth limit" : ", growth disabled");
}

}  // namespace rdmakit::kv
