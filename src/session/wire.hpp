#pragma once
// The session's wire formats: connection handshake (private data), message
// header, control block layout and work request ids. Little-endian hosts only
// (checked), fixed sizes, versioned.
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <rdmakit/detail/bit_fields.hpp>
#include <rdmakit/rdmakit.hpp>
#include <span>
#include <string>
#include <vector>

namespace rdmakit::session::detail {

static_assert(std::endian::native == std::endian::little,
              "the session wire format is little-endian");

constexpr uint32_t kMagic = 0x53534b52;  // "RKSS"
constexpr uint16_t kVersion = 2;         // 2: header-less SEND_WITH_IMM data messages
constexpr uint32_t kMaxChannels = 16;
constexpr uint32_t kMaxDepth = 4096;
constexpr size_t kMaxChannelName = 32;
constexpr size_t kMaxBufferName = 64;
// Smallest receive slot payload: the buffer table must fit in one message.
constexpr uint32_t kMinMessage = 2048;

// Client -> server, in the private data of each channel's connect.
struct Hello {
  uint64_t endpoint_id = 0;
  uint32_t channel = 0;
  uint32_t channels = 0;
  uint32_t depth = 0;        // client's RECVs per channel
  uint32_t max_message = 0;  // client's largest message
};
// Kept within the 52 bytes an IB/RoCE CM request carries whole (the verbs
// provider otherwise READs the rest onto a CQ a worker may be polling):
// the control block and the channel names travel in the buffer table.
constexpr size_t kHelloSize = 30;
// Server -> client, in the accept reply (the same for every accept).
struct Reply {
  uint32_t depth = 0;
  uint32_t max_message = 0;
  uint16_t channel_port = 0;  // listener for channels 1..n-1
};

std::vector<std::byte> encode(const Hello& hello);
std::optional<Hello> decode_hello(std::span<const std::byte> in, std::string* why);
std::vector<std::byte> encode(const Reply& reply);
std::optional<Reply> decode_reply(std::span<const std::byte> in, std::string* why);

// Copied data messages travel as SEND_WITH_IMM carrying kDataImm and no
// header, so that an 8-byte message is 8 bytes on the wire (the shm
// provider carries up to 20 bytes in the receive slot itself; a header
// pushed small messages onto its kernel-copy path). Every other SEND (control
// messages, zero-copy sends) starts with this header (Buffer::kHeadroomBytes
// bytes).
constexpr uint32_t kDataImm = 0x44534b52;  // "RKSD"
enum class MsgKind : uint16_t { kData = 1, kTable = 2, kGoodbye = 3 };
struct MsgHeader {
  uint32_t magic;
  uint16_t kind;
  uint16_t reserved;
  uint64_t length;  // payload bytes after the header
};
static_assert(sizeof(MsgHeader) == 16);

// Control block each side allocates per endpoint; the peer WRITEs into it.
constexpr size_t kCtrlHeartbeat = 0;  // u64: the peer's heartbeat count
constexpr size_t kCtrlCredits = 64;   // u64 per channel: peer's re-posted RECVs
constexpr size_t kCtrlSize = 4096;
static_assert(kCtrlCredits + size_t{8} * kMaxChannels <= kCtrlSize);

// Reads a word the peer WRITEs one-sided into our control block. The writer
// is the transport (a NIC's DMA, another process on shm, the tcp provider's
// receive thread), never a thread of ours, so this is a plain aligned load
// that the thread sanitizer does not instrument; the acquire fence orders
// what follows it.
__attribute__((no_sanitize("thread"))) inline uint64_t load_peer_written(
    const uint64_t* word) noexcept {
  const uint64_t value = *static_cast<const volatile uint64_t*>(word);
  std::atomic_thread_fence(std::memory_order_acquire);
  return value;
}

// The buffer table (sent as a kTable message on channel 0): the sender's
// control block, its channel names, then (name, RemoteRegion) entries.
struct Table {
  RemoteRegion ctrl;
  std::vector<std::string> channel_names;
  std::vector<std::pair<std::string, RemoteRegion>> buffers;
};
std::vector<std::byte> encode(const Table& table);
std::optional<Table> decode_table(std::span<const std::byte> in, std::string* why);

// Work request ids: [slot:16][generation:16][channel:8][kind:8][index:16].
// kOpQuiet: a WRITE/READ/WRITE_WITH_IMM without a callback, selectively
// signaled (only its errors reach the completion path).
enum class WrKind : uint8_t {
  kRecv = 1,
  kSendCopy,
  kSendZeroCopy,
  kOp,
  kInternal,
  kOpQuiet
};
// At most this many WRs in a row go unsignaled on a send queue, so that a
// signaled completion retires them well before the queue (max_send_wr >= 72)
// fills.
constexpr uint32_t kSignalEvery = 16;
using WrId = rdmakit::detail::BitFields<16, 16, 8, 8, 16>;
constexpr uint64_t make_wr_id(uint32_t slot, uint16_t gen, uint32_t channel, WrKind kind,
                              uint32_t index) noexcept {
  return WrId::encode(slot, gen, channel, kind, index);
}
constexpr uint32_t wr_slot(uint64_t id) noexcept { return WrId::decode<0, uint32_t>(id); }
constexpr uint16_t wr_gen(uint64_t id) noexcept { return WrId::decode<1, uint16_t>(id); }
constexpr uint32_t wr_channel(uint64_t id) noexcept {
  return WrId::decode<2, uint32_t>(id);
}
constexpr WrKind wr_kind(uint64_t id) noexcept { return WrId::decode<3, WrKind>(id); }
constexpr uint32_t wr_index(uint64_t id) noexcept {
  return WrId::decode<4, uint32_t>(id);
}
static_assert(kMaxChannels - 1 <= WrId::max<2>() && kMaxDepth - 1 <= WrId::max<4>());
static_assert(make_wr_id(513, 7, 3, WrKind::kOp, 65535) == 0x020100070304ffff);
static_assert(wr_slot(make_wr_id(513, 7, 3, WrKind::kOp, 65535)) == 513);
static_assert(wr_gen(make_wr_id(513, 7, 3, WrKind::kOp, 65535)) == 7);
static_assert(wr_channel(make_wr_id(513, 7, 3, WrKind::kOp, 65535)) == 3);
static_assert(wr_kind(make_wr_id(513, 7, 3, WrKind::kOp, 65535)) == WrKind::kOp);
static_assert(wr_index(make_wr_id(513, 7, 3, WrKind::kOp, 65535)) == 65535);

}  // namespace rdmakit::session::detail
