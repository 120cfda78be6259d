#pragma once
// rdmakit-cp wire format. Two streams:
//  - control messages (Channel::send/recv): hello, probes for --resume,
//    acks of slots, per-file errors, end of stream, final report;
//  - the data stream: the sender fills fixed-size slots with records (entry,
//    data, end of file) and WRITEs each slot into the receiver's exposed
//    "slots" buffer with an immediate (the slot index). A slot carries the
//    xxh3 of its records (the payload without file data) and each data record
//    the running xxh3 of its block (records.hpp); the receiver acks a slot
//    (free again) or nacks it (re-sent) when either check fails. Small files
//    share slots, so 10,000 files are a few dozen WRITEs.
// Everything is little-endian (both ends are x86/arm64 Linux; checked below).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmakit::cp {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian");

// 2: the slot hash covers the records only; data records carry block digests.
// 3: sync: the sender lists entries first (kCheck), the receiver's generator
//    answers what to send (kWant), with delta blocks and deletions.
// 4: lanes: the hello asks for lanes, its reply grants them with a join
//    token each; acks name the lane; lane connections join with kLaneJoin.
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr uint32_t kSlotMagic = 0x52434b53;  // "SKCR"
inline constexpr uint32_t kSlots = 8;               // chunks in flight
inline constexpr uint32_t kSlotSize = 1u << 20;     // bytes per slot (header included)
inline constexpr uint64_t kBlockSize = 1u << 20;    // resume/hash granularity
inline constexpr uint32_t kMaxMessage = 64 * 1024;
inline constexpr uint32_t kMaxResends = 5;
// Entries the sender may list ahead of the answers it has (its window); the
// receiver refuses a sender that lists more.
inline constexpr uint32_t kListWindow = 8192;
inline constexpr const char* kSlotsBuffer = "slots";
inline constexpr uint64_t kLaneBytes = uint64_t{kSlots} * kSlotSize;
// Lanes (lanes.hpp): connections one copy stripes its slots over, each with
// a slots buffer of its own (kLaneBytes). kMaxLanes bounds a copy's lanes.
inline constexpr uint32_t kMaxLanes = 8;
inline constexpr size_t kJoinTokenBytes = 32;
// Concurrent transfers a server admits by default (--max-clients); each holds
// kLaneBytes of registered memory on the server.
inline constexpr uint32_t kDefaultMaxClients = 16;
inline constexpr uint32_t kMaxMaxClients = 1024;

struct SlotHeader {
  uint32_t magic;
  uint32_t seq;
  uint32_t payload_len;
  uint32_t reserved;
  uint64_t records_hash;  // records_hash() of the payload (file data excluded)
  uint64_t reserved2;
};
static_assert(sizeof(SlotHeader) == 32);
inline constexpr uint32_t kSlotPayload = kSlotSize - sizeof(SlotHeader);

enum class Msg : uint8_t {
  kHello = 1,       // client -> server
  kHelloReply = 2,  // server -> client
  kTotals = 3,      // sender -> receiver: files, bytes (for progress)
  // 4 and 5 were protocol 2's resume probes.
  kAck = 6,        // receiver -> sender: slot processed (ok) or corrupt (resend)
  kFileError = 7,  // either way: one path failed, with class and reason
  kDone = 8,       // sender -> receiver: number of slots in the stream
  kFinal = 9,      // receiver -> sender: the receiver's totals
  kFatal = 10,     // either way: the transfer cannot continue
  // Authentication (auth.hpp), before the hello when the client has a secret.
  kAuthNonce = 11,      // client -> server: client nonce
  kAuthChallenge = 12,  // server -> client: ok, server nonce, server proof (or why not)
  kAuthProof = 13,      // client -> server: client proof
  // Sync (generator.hpp): what the sender has, what the receiver wants.
  kCheck = 14,    // sender -> receiver: a batch of entries' metadata
  kListEnd = 15,  // sender -> receiver: no more entries (deletions may start)
  kWant = 16,     // receiver -> sender: per listed entry, skip / send / delta
  kDeleted = 17,  // receiver -> sender: paths deleted (--delete), for -i and --stats
  kListed = 18,   // receiver -> sender: every listed entry answered, deletions done
  // Lanes: the first message of a lane connection (a join token), its answer.
  kLaneJoin = 19,   // client -> server: u32 lane, join token
  kLaneReply = 20,  // server -> client: u8 ok, str reason
};

enum class Rec : uint8_t { kEntry = 1, kData = 2, kEnd = 3, kAbort = 4 };
// kHardlink: a file that is the same inode as an earlier entry (-H); its
// link field names that entry's path.
enum class Kind : uint8_t { kFile = 1, kDir = 2, kSymlink = 3, kHardlink = 4 };
enum class Op : uint8_t { kPush = 1, kPull = 2 };
enum HelloFlags : uint8_t { kFlagResume = 1, kFlagRecursive = 2 };
// What a sync compares and keeps (the hello's sync word; rsync's options).
enum SyncFlags : uint32_t {
  kSyncChecksum = 1u << 0,         // -c: compare content, not size and mtime
  kSyncDelete = 1u << 1,           // --delete
  kSyncDryRun = 1u << 2,           // -n
  kSyncWholeFile = 1u << 3,        // -W: no delta
  kSyncOwner = 1u << 4,            // -o
  kSyncGroup = 1u << 5,            // -g
  kSyncNumericIds = 1u << 6,       // --numeric-ids
  kSyncAcls = 1u << 7,             // -A
  kSyncXattrs = 1u << 8,           // -X
  kSyncHardLinks = 1u << 9,        // -H
  kSyncDeleteExcluded = 1u << 10,  // --delete-excluded
  kSyncIgnoreTimes = 1u << 11,     // -I: send even what the quick check passes
  kSyncKnown = (1u << 12) - 1,
};
// The generator's answer for one listed entry.
enum class Want : uint8_t { kSkip = 0, kSend = 1, kDelta = 2 };
// Itemized changes (rsync's %i), one bit per letter; kItemNew is "+++++++++".
enum ItemBits : uint16_t {
  kItemNew = 1u << 0,
  kItemChecksum = 1u << 1,
  kItemSize = 1u << 2,
  kItemTime = 1u << 3,
  kItemPerms = 1u << 4,
  kItemOwner = 1u << 5,
  kItemGroup = 1u << 6,
  kItemAcl = 1u << 7,
  kItemXattr = 1u << 8,
  kItemTransfer = 1u << 9,  // content moves (rsync's '<' / '>')
  kItemKnown = (1u << 10) - 1,
};

// Appends little-endian fields to a byte vector.
class Writer {
 public:
  template <typename T>
  Writer& put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    raw(&v, sizeof(T));
    return *this;
  }
  Writer& str(std::string_view s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
    return *this;
  }
  Writer& bytes(std::span<const std::byte> b) {
    raw(b.data(), b.size());
    return *this;
  }
  std::vector<std::byte>& data() { return out_; }

 private:
  // Not inlined: GCC 12 at -O3 reports false out-of-bounds writes when it
  // inlines small appends into a vector (control path only; no cost that
  // matters).
  [[gnu::noinline]] void raw(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }
  std::vector<std::byte> out_;
};

// Reads fields with bounds checks; any short read marks the reader bad
// (a malformed frame is refused, never trusted).
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get() {
    T v{};
    if (pos_ + sizeof(T) > in_.size()) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(size_t max = 65536) {
    const auto n = get<uint32_t>();
    if (bad_ || n > max || pos_ + n > in_.size()) {
      bad_ = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::span<const std::byte> take(size_t n) {
    if (pos_ + n > in_.size()) {
      bad_ = true;
      return {};
    }
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  bool ok() const { return !bad_; }
  bool at_end() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool bad_ = false;
};

inline Writer message(Msg type) {
  Writer w;
  w.put<uint8_t>(static_cast<uint8_t>(type));
  return w;
}

}  // namespace rdmakit::cp
