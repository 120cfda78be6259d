// The table and the message format in one process: placement, collisions,
// long entries, growth with kMoved slots, and the reader's rejection of torn
// and half-written snapshots.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "auth.hpp"
#include "protocol.hpp"
#include "rdmakit/rdmakit.hpp"
#include "table.hpp"
#include "table_layout.hpp"

namespace rdmakit::kv {
namespace {

std::unique_ptr<Context> shm_context() {
  ContextOptions o;
  o.provider = ProviderKind::kShm;
  return Context::open(o);
}

// What a READ-GET sees, with the READ done as a plain copy of our own table.
struct Snapshot {
  std::vector<std::byte> slots;
  const TableInfo info;
  explicit Snapshot(const TableInfo& t, std::string_view key) : info(t) {
    const auto* base = reinterpret_cast<const std::byte*>(t.region.addr);
    const uint64_t home = t.home_bucket(key_hash(key));
    slots.assign(base + t.slot_offset(home),
                 base + t.slot_offset(home) + kNeighborhood * kSlotSize);
  }
};

// As the client does it: the first kFirstReadSlots slots, and all the home
// slot's reach only if it says more. *reads counts the READs.
Probe read_get(const TableInfo& t, std::string_view key, std::string* value,
               int* reads = nullptr) {
  Snapshot s(t, key);
  const std::span<const std::byte> all(s.slots);
  ProbeResult p = probe_neighborhood(all.first(kFirstReadSlots * kSlotSize), key, value);
  if (reads != nullptr) *reads = 1;
  if (p.probe == Probe::kMore) {
    EXPECT_GT(p.reach, kFirstReadSlots);
    p = probe_neighborhood(all.first(p.reach * kSlotSize), key, value);
    if (reads != nullptr) *reads = 2;
  }
  if (p.probe != Probe::kIndirect) return p.probe;
  const auto* block =
      reinterpret_cast<const std::byte*>(t.region.addr) + t.block_offset(p.block);
  return verify_block({block, kBlockHeader + key.size() + p.value_len}, key, p.seq, value)
             ? Probe::kFound
             : Probe::kRetry;
}

TEST(KvTable, PutGetDeleteInlineAndLong) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 64, .blocks = 4});
  const std::string long_value(kMaxValue, 'L');
  const std::string max_key(kMaxKey, 'K');
  ASSERT_EQ(table.put("a", "1"), PutOutcome::kOk);
  ASSERT_EQ(table.put(max_key, long_value), PutOutcome::kOk);
  ASSERT_EQ(table.put("b", std::string(200, 'b')), PutOutcome::kOk);
  std::string v;
  EXPECT_EQ(read_get(table.info(), "a", &v), Probe::kFound);
  EXPECT_EQ(v, "1");
  EXPECT_EQ(read_get(table.info(), max_key, &v), Probe::kFound);
  EXPECT_EQ(v, long_value);
  ASSERT_TRUE(table.get("b", &v));
  EXPECT_EQ(v, std::string(200, 'b'));
  // Long -> inline -> long again reuses blocks (4 blocks, many rewrites).
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(table.put("b", i % 2 ? "short" : std::string(300, char('a' + i))),
              PutOutcome::kOk);
    ASSERT_EQ(read_get(table.info(), "b", &v), Probe::kFound);
    EXPECT_EQ(v, i % 2 ? "short" : std::string(300, char('a' + i)));
  }
  EXPECT_EQ(table.size(), 3u);
  EXPECT_TRUE(table.erase("a"));
  EXPECT_FALSE(table.erase("a"));
  EXPECT_EQ(read_get(table.info(), "a", &v), Probe::kAbsent);
  EXPECT_FALSE(table.get("a", &v));
  EXPECT_EQ(table.size(), 2u);
}

TEST(KvTable, CollidingKeysShareANeighborhood) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 8, .grow = false});  // 16 buckets
  // Keys with the same home bucket.
  std::vector<std::string> same;
  const uint64_t home = table.info().home_bucket(key_hash("0"));
  for (int i = 0; same.size() < kNeighborhood + 1; ++i) {
    std::string k = std::to_string(i);
    if (table.info().home_bucket(key_hash(k)) == home) same.push_back(k);
  }
  for (size_t i = 0; i < kNeighborhood; ++i)
    ASSERT_EQ(table.put(same[i], same[i] + "!"), PutOutcome::kOk);
  // The neighborhood is full: refused (growth disabled), others intact.
  EXPECT_EQ(table.put(same[kNeighborhood], "x"), PutOutcome::kFullNeighborhood);
  EXPECT_NE(table.full_reason(PutOutcome::kFullNeighborhood).find("table full"),
            std::string::npos);
  std::string v;
  for (size_t i = 0; i < kNeighborhood; ++i) {
    ASSERT_EQ(read_get(table.info(), same[i], &v), Probe::kFound) << same[i];
    EXPECT_EQ(v, same[i] + "!");
  }
  // A delete frees a slot for the refused key.
  ASSERT_TRUE(table.erase(same[3]));
  EXPECT_EQ(table.put(same[kNeighborhood], "x"), PutOutcome::kOk);
  EXPECT_EQ(read_get(table.info(), same[3], &v), Probe::kAbsent);
}

Slot slot_at(const TableInfo& t, uint64_t index) {
  Slot s;
  std::memcpy(&s,
              reinterpret_cast<const std::byte*>(t.region.addr) + t.slot_offset(index),
              sizeof s);
  return s;
}

TEST(KvTable, HomeSlotReachBoundsTheReadGet) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 8, .grow = false});  // 16 buckets
  std::vector<std::string> same;
  const uint64_t home = table.info().home_bucket(key_hash("0"));
  for (int i = 0; same.size() < kFirstReadSlots + 3; ++i) {
    std::string k = std::to_string(i);
    if (table.info().home_bucket(key_hash(k)) == home) same.push_back(k);
  }
  EXPECT_EQ(slot_at(table.info(), home).reach, 0);
  std::string v;
  int reads = 0;
  // An empty bucket: absent after one READ.
  EXPECT_EQ(read_get(table.info(), same[0], &v, &reads), Probe::kAbsent);
  EXPECT_EQ(reads, 1);
  for (size_t i = 0; i < same.size(); ++i) {
    ASSERT_EQ(table.put(same[i], same[i] + "!"), PutOutcome::kOk);
    // Every key of the bucket lies within the home slot's reach.
    EXPECT_EQ(slot_at(table.info(), home).reach, i + 1);
  }
  for (size_t i = 0; i < same.size(); ++i) {
    ASSERT_EQ(read_get(table.info(), same[i], &v, &reads), Probe::kFound) << same[i];
    EXPECT_EQ(v, same[i] + "!");
    // The home slot tells every READ-GET of the bucket to read on.
    EXPECT_EQ(reads, 2);
  }
  // A delete leaves the reach: the last key is still found.
  for (size_t i = 0; i + 1 < same.size(); ++i) ASSERT_TRUE(table.erase(same[i]));
  EXPECT_EQ(slot_at(table.info(), home).reach, same.size());
  ASSERT_EQ(read_get(table.info(), same.back(), &v), Probe::kFound);
  EXPECT_EQ(read_get(table.info(), same[0], &v), Probe::kAbsent);
  // A key of the next bucket takes a free slot inside our reach: our reach
  // stays, and it is found through its own home slot.
  const uint64_t next = (home + 1) & (table.info().buckets - 1);
  std::string other;
  for (int i = 1000; other.empty(); ++i) {
    std::string k = std::to_string(i);
    if (table.info().home_bucket(key_hash(k)) == next) other = k;
  }
  ASSERT_EQ(table.put(other, "o"), PutOutcome::kOk);
  EXPECT_EQ(slot_at(table.info(), home).reach, same.size());
  EXPECT_EQ(slot_at(table.info(), next).reach, 1);
  EXPECT_EQ(read_get(table.info(), other, &v), Probe::kFound);
  EXPECT_EQ(v, "o");
  // A reach past the neighborhood never comes from a sealed slot: rejected.
  Snapshot s(table.info(), same.back());
  Slot h;
  std::memcpy(&h, s.slots.data(), sizeof h);
  h.reach = kNeighborhood + 1;
  h.check = slot_check(h);
  std::memcpy(s.slots.data(), &h, sizeof h);
  EXPECT_EQ(probe_neighborhood(s.slots, same.back(), &v).probe, Probe::kRetry);
}

TEST(KvTable, FullBlocksAreRefusedWithoutGrowth) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 64, .blocks = 2, .grow = false});
  ASSERT_EQ(table.put("x", std::string(1000, 'x')), PutOutcome::kOk);
  ASSERT_EQ(table.put("y", std::string(1000, 'y')), PutOutcome::kOk);
  EXPECT_EQ(table.put("z", std::string(1000, 'z')), PutOutcome::kFullBlocks);
  EXPECT_NE(table.full_reason(PutOutcome::kFullBlocks).find("blocks"), std::string::npos);
  EXPECT_EQ(table.put("z", "small"), PutOutcome::kOk);  // inline still fits
  std::string v;
  ASSERT_EQ(read_get(table.info(), "y", &v), Probe::kFound);
  EXPECT_EQ(v, std::string(1000, 'y'));
}

TEST(KvTable, GrowthMovesEveryEntryAndRetiresTheOldTable) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 8, .blocks = 1});
  const TableInfo first = table.info();
  std::map<std::string, std::string> want;
  for (int i = 0; i < 500; ++i) {
    const std::string k = "key" + std::to_string(i);
    want[k] = i % 10 == 0 ? std::string(500, char('a' + i % 26)) : std::to_string(i * 7);
    ASSERT_EQ(table.put(k, want[k]), PutOutcome::kOk);
  }
  EXPECT_GT(table.epoch(), first.epoch);
  EXPECT_GE(table.info().buckets, 512u);
  std::string v;
  for (const auto& [k, val] : want) {
    ASSERT_EQ(read_get(table.info(), k, &v), Probe::kFound) << k;
    EXPECT_EQ(v, val);
  }
  // A reader with the first table's descriptor is told to move, never served
  // what the old table held.
  EXPECT_EQ(read_get(first, "key1", &v), Probe::kMoved);
  EXPECT_EQ(reinterpret_cast<const TableHeader*>(first.region.addr)->retired, 1u);
}

TEST(KvTable, TornAndHalfWrittenSnapshotsAreRejected) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 64});
  ASSERT_EQ(table.put("k", "old-value"), PutOutcome::kOk);
  Snapshot before(table.info(), "k");
  ASSERT_EQ(table.put("k", "new-value"), PutOutcome::kOk);
  Snapshot after(table.info(), "k");
  std::string v;
  ASSERT_EQ(probe_neighborhood(before.slots, "k", &v).probe, Probe::kFound);
  EXPECT_EQ(v, "old-value");
  ASSERT_EQ(probe_neighborhood(after.slots, "k", &v).probe, Probe::kFound);
  EXPECT_EQ(v, "new-value");
  // Every split of the two states at a byte boundary (a copy racing the
  // store) is either one whole state or rejected.
  size_t rejected = 0;
  for (size_t cut = 1; cut < before.slots.size(); ++cut) {
    std::vector<std::byte> mixed = before.slots;
    std::memcpy(mixed.data() + cut, after.slots.data() + cut, mixed.size() - cut);
    std::string got;
    const Probe p = probe_neighborhood(mixed, "k", &got).probe;
    if (p == Probe::kRetry) {
      ++rejected;
      continue;
    }
    ASSERT_EQ(p, Probe::kFound) << "cut " << cut;
    ASSERT_TRUE(got == "old-value" || got == "new-value")
        << "torn at " << cut << ": " << got;
  }
  EXPECT_GT(rejected, 0u);
  // A slot the server is writing (odd version) is retried.
  std::vector<std::byte> odd = after.slots;
  for (size_t i = 0; i < kNeighborhood; ++i) {
    Slot s;
    std::memcpy(&s, odd.data() + i * kSlotSize, sizeof s);
    s.version |= 1;
    std::memcpy(odd.data() + i * kSlotSize, &s, sizeof s);
  }
  EXPECT_EQ(probe_neighborhood(odd, "k", &v).probe, Probe::kRetry);
}

// A slot's check covers its header and the entry's key and value, not the
// unused rest of the data; the reader's check (xxh3's short-input routine,
// called directly) gives what the server's slot_check gives at every length.
TEST(KvTable, SlotCheckCoversTheEntryAndNothingElse) {
  const std::string key = "k";
  for (size_t value_len = 0; key.size() + value_len <= kInlineBytes; ++value_len) {
    Slot s{};
    s.version = 6;
    s.seq = 9;
    s.key_hash = key_hash(key);
    s.key_len = uint32_t(key.size());
    s.value_len = uint32_t(value_len);
    s.block = kNoBlock;
    s.state = uint16_t(SlotState::kInline);
    s.reach = 1;
    for (size_t i = 0; i < kInlineBytes; ++i) s.data[i] = std::byte(i * 7 + value_len);
    std::memcpy(s.data, key.data(), key.size());
    s.check = slot_check(s);
    std::vector<std::byte> snap(kSlotSize);
    std::memcpy(snap.data(), &s, sizeof s);
    std::string v;
    ASSERT_EQ(probe_neighborhood(snap, key, &v).probe, Probe::kFound) << value_len;
    ASSERT_EQ(v.size(), value_len);
    const size_t used = kSlotHeader + key.size() + value_len;
    for (size_t at = sizeof(uint64_t); at < kSlotSize; ++at) {
      std::vector<std::byte> bad = snap;
      bad[at] ^= std::byte{0x20};
      const Probe p = probe_neighborhood(bad, key, &v).probe;
      if (at < used) {
        // A changed byte of what the answer depends on: rejected, or a
        // field that makes the slot not hold the key (absent).
        EXPECT_NE(p, Probe::kFound)
            << "byte " << at << " of a " << value_len << " B value";
      } else {
        EXPECT_EQ(p, Probe::kFound) << "unused byte " << at;
      }
    }
  }
}

// Only the slot a hit comes from is verified: a home slot that holds another
// key and is being rewritten does not hold up a GET of a key further on,
// since its reach (one byte that only grows) is what the GET uses of it.
TEST(KvTable, ARewriteOfAnotherKeysHomeSlotDoesNotDisturbAHit) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 8, .grow = false});  // 16 buckets
  std::vector<std::string> same;
  const uint64_t home = table.info().home_bucket(key_hash("0"));
  for (int i = 0; same.size() < 2; ++i) {
    std::string k = std::to_string(i);
    if (table.info().home_bucket(key_hash(k)) == home) same.push_back(k);
  }
  ASSERT_EQ(table.put(same[0], "first-old"), PutOutcome::kOk);  // the home slot
  ASSERT_EQ(table.put(same[1], "second"), PutOutcome::kOk);     // home + 1
  Snapshot before(table.info(), same[1]);
  ASSERT_EQ(table.put(same[0], "first-new"), PutOutcome::kOk);
  Snapshot after(table.info(), same[1]);
  size_t first_rejected = 0;
  for (size_t cut = 1; cut < kSlotSize; ++cut) {
    std::vector<std::byte> mixed = before.slots;
    std::memcpy(mixed.data() + cut, after.slots.data() + cut, kSlotSize - cut);
    std::string v;
    ASSERT_EQ(probe_neighborhood(mixed, same[1], &v).probe, Probe::kFound) << cut;
    EXPECT_EQ(v, "second");
    const Probe p = probe_neighborhood(mixed, same[0], &v).probe;
    if (p == Probe::kRetry) {
      ++first_rejected;
      continue;
    }
    ASSERT_EQ(p, Probe::kFound) << cut;
    ASSERT_TRUE(v == "first-old" || v == "first-new") << "torn at " << cut << ": " << v;
  }
  EXPECT_GT(first_rejected, 0u);
}

TEST(KvTable, ReusedBlockIsNotTakenForTheOldEntry) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 64, .blocks = 2});
  const std::string a(400, 'a');
  ASSERT_EQ(table.put("k", a), PutOutcome::kOk);
  Snapshot old(table.info(), "k");
  std::string v;
  const ProbeResult p = probe_neighborhood(old.slots, "k", &v);
  ASSERT_EQ(p.probe, Probe::kIndirect);
  // Rewrites until the old block is reused by another entry.
  ASSERT_EQ(table.put("k", std::string(400, 'b')), PutOutcome::kOk);
  ASSERT_EQ(table.put("other", std::string(400, 'c')), PutOutcome::kOk);
  const auto* block = reinterpret_cast<const std::byte*>(table.info().region.addr) +
                      table.info().block_offset(p.block);
  EXPECT_FALSE(verify_block({block, kBlockHeader + 1 + p.value_len}, "k", p.seq, &v));
}

TEST(KvTable, TableInfoRoundTripsAndRejectsBadGeometry) {
  auto ctx = shm_context();
  Table table(*ctx, {.capacity = 100});
  const auto blob = table.info().serialize();
  ASSERT_LE(blob.size(), Context::kMaxPrivateData);
  auto back = TableInfo::deserialize(blob);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->buckets, table.info().buckets);
  EXPECT_EQ(back->region, table.info().region);
  TableInfo bad = table.info();
  bad.block_count = 1u << 30;  // beyond the region
  EXPECT_FALSE(TableInfo::deserialize(bad.serialize()));
  bad = table.info();
  bad.buckets = 100;  // not a power of two
  EXPECT_FALSE(TableInfo::deserialize(bad.serialize()));
  // Products that wrap: 2^57 buckets make slot_count * 128 wrap to 1920, which
  // would pass a check formed with it, and then cost the client a byte per
  // bucket; a block count whose product with the block size wraps.
  bad = table.info();
  bad.buckets = uint64_t{1} << 57;
  bad.slot_count = bad.buckets + kNeighborhood - 1;
  bad.blocks_offset = kTableHeader + bad.slot_count * kSlotSize;
  bad.block_count = 0;
  EXPECT_FALSE(TableInfo::deserialize(bad.serialize()));
  bad = table.info();
  bad.buckets = kMaxDescribedBuckets * 2;
  bad.slot_count = bad.buckets + kNeighborhood - 1;
  EXPECT_FALSE(TableInfo::deserialize(bad.serialize()));
  bad = table.info();
  bad.block_count = UINT64_MAX / kBlockSize + 2;
  EXPECT_FALSE(TableInfo::deserialize(bad.serialize()));
  EXPECT_FALSE(TableInfo::deserialize(std::span(blob).first(10)));
}

TEST(KvProtocol, MalformedRequestsAreNamed) {
  std::vector<std::byte> buf(kMaxRequest);
  KvStatus s;
  std::string why;
  uint64_t id;
  size_t n = encode_request(buf, Op::kPut, 7, "key", "value");
  auto ok = parse_request({buf.data(), n}, &s, &why, &id);
  ASSERT_TRUE(ok);
  EXPECT_EQ(s, KvStatus::kOk);
  EXPECT_EQ(ok->key, "key");
  EXPECT_EQ(ok->value, "value");
  EXPECT_FALSE(parse_request({buf.data(), 5}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kMalformed);
  EXPECT_FALSE(parse_request({buf.data(), n - 1}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kMalformed);
  EXPECT_EQ(id, 7u);
  n = encode_request(buf, Op::kGet, 8, std::string(kMaxKey + 1, 'k'), "");
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kKeyTooLong);
  n = encode_request(buf, Op::kGet, 8, "", "");
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kKeyTooLong);
  n = encode_request(buf, Op::kGet, 9, "k", "v");
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kMalformed);
  n = encode_request(buf, static_cast<Op>(99), 9, "k", "");
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kUnknownOp);
  buf[0] = std::byte{0};
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_NE(why.find("magic"), std::string::npos);
  // Every field counts: reserved bytes set, a key on TABLE.
  n = encode_request(buf, Op::kGet, 10, "k", "");
  buf[offsetof(RequestHeader, reserved)] = std::byte{1};
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_NE(why.find("reserved"), std::string::npos) << why;
  n = encode_request(buf, Op::kGet, 10, "k", "");
  buf[offsetof(RequestHeader, reserved2) + 3] = std::byte{0x80};
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  n = encode_request(buf, Op::kTable, 11, "k", "");
  EXPECT_FALSE(parse_request({buf.data(), n}, &s, &why, &id));
  EXPECT_EQ(s, KvStatus::kMalformed);
  n = encode_request(buf, Op::kTable, 12, "", "");
  EXPECT_TRUE(parse_request({buf.data(), n}, &s, &why, &id));
}

// The handshake messages (auth.hpp): each parses back to what was encoded,
// and anything else is refused whole.
TEST(KvHandshake, MessagesRoundTripAndRejectTheRest) {
  const auth::Nonce nonce = auth::fresh_nonce();
  const auto hello = encode_hello(nonce);
  ASSERT_EQ(hello.size(), kHelloBytes);
  EXPECT_EQ(parse_hello(hello), nonce);
  EXPECT_FALSE(parse_hello(std::span(hello).first(hello.size() - 1)));
  EXPECT_FALSE(parse_challenge(hello));  // another message's magic
  const auto challenge = encode_challenge({.auth_required = true, .server_nonce = nonce});
  const auto c = parse_challenge(challenge);
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->auth_required);
  EXPECT_EQ(c->server_nonce, nonce);
  auto bad = challenge;
  bad[4] = std::byte{2};  // flag out of range
  EXPECT_FALSE(parse_challenge(bad));
  bad = challenge;
  bad[6] = std::byte{1};  // padding not zero
  EXPECT_FALSE(parse_challenge(bad));
  const std::vector<std::byte> info(68, std::byte{7});
  const auto ok = parse_welcome(encode_welcome(AuthStatus::kOk, {}, info));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->table_info.size(), info.size());
  // A refusal never carries the descriptor.
  const auto refused = encode_welcome(AuthStatus::kWrongSecret, {}, info);
  EXPECT_EQ(refused.size(), kWelcomeHeaderBytes);
  auto with_tail = refused;
  with_tail.push_back(std::byte{0});
  EXPECT_FALSE(parse_welcome(with_tail));
}

}  // namespace
}  // namespace rdmakit::kv
