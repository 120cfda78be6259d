#pragma once
// The stream protocol: every message is a WRITE_WITH_IMM; the 32-bit
// immediate says what it is. Data lands in the receiver's ring at offsets the
// receiver computes itself (its own count of bytes received modulo the ring
// size); nothing a peer sends is ever used as an address or an offset here.
//
//   bits 31..30  op      0 DATA, 1 CREDIT, 2 CTRL (3 is a protocol error)
//   bits 29..22  msgs    receives the sender has reposted since it last said
//   bits 21..0   value   DATA: bytes written (== the completion's byte_len)
//                        CREDIT: ring bytes consumed since the last CREDIT
//                        CTRL: 1 FIN, 2 RST, 3 KEEPALIVE
//                        DATA with kRewind set: the bytes start at the ring's
//                        beginning (below)
//
// A DATA of at most the receiver's Hello::record_max bytes may come as a
// SEND_WITH_IMM instead (a "record"): the bytes ride in the message itself
// and land in one of the receiver's small posted receive buffers, from which
// the receiver copies them into its ring at its own write position
// (place_record). On shm the payload is then inside the one cache line of
// the receive slot, as for a core SEND, instead of a second line in the ring.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "rdmakit/detail/hello_frame.hpp"
#include "rdmakit/detail/small_copy.hpp"
#include "rdmakit/memory.hpp"

namespace rdmakit::stream::wire {

enum class Op : uint32_t { kData = 0, kCredit = 1, kCtrl = 2 };
enum Ctrl : uint32_t { kFin = 1, kRst = 2, kKeepalive = 3 };

constexpr uint32_t kValueBits = 22;
constexpr uint32_t kValueMask = (1u << kValueBits) - 1;
constexpr uint32_t kMsgShift = 22;
constexpr uint32_t kMsgMask = 0xFF;
constexpr uint32_t kOpShift = 30;

constexpr uint32_t kMinRing = 4096;
constexpr uint32_t kMaxRing = 2u << 20;  // byte credits fit in value
constexpr uint32_t kMinCredits = 8;
constexpr uint32_t kMaxCredits = kMsgMask;  // fits in msgs
static_assert(kMaxRing <= kValueMask, "a whole ring's credit fits one CREDIT");
// Message credits a sender keeps back so that credit returns and the end of
// the stream can always be sent (no credit deadlock): DATA leaves
// kDataReserve for CREDIT/KEEPALIVE, FIN and RST; CREDIT and KEEPALIVE leave
// kCreditReserve for FIN and RST; FIN and RST need one credit.
constexpr uint32_t kDataReserve = 3;
constexpr uint32_t kCreditReserve = 2;
constexpr uint32_t kCloseReserve = 1;
static_assert(kDataReserve > kCreditReserve && kCreditReserve > kCloseReserve);
static_assert(kCloseReserve >= 1);
// Bytes one record receive buffer takes: the largest record this side
// accepts, announced in its hello (Hello::record_max). A writer never
// assumes it: it sends records of at most the peer's announcement and its
// own QP's max_inline(). 20 is what the shm provider carries inside a
// receive slot, so a record is one cache line there; a larger SEND would be
// written into the receive buffer, a second line again.
constexpr uint32_t kRecordData = 20;
// Stride of the receive buffers (one per posted receive).
constexpr uint32_t kRecordStride = 32;
static_assert(kRecordData <= kRecordStride && kRecordData <= 0xFF);
// Ring rewind: a writer that knows the peer's ring is empty (every byte it
// sent was credited back) and not at its start flags its next DATA; writer
// and reader then both advance their counts to the next multiple of the ring
// size, so positions stay `count % ring_size` and the bytes land at offset 0.
// A request/response stream so keeps to the ring's first pages, and a ring
// whose pages are allocated on first touch costs only what is touched.
// DATA values are at most 1 MiB (a WRITE) or the record size: bit 21 is free.
constexpr uint32_t kRewind = 1u << 21;
// The reader sends an early CREDIT when a read empties its ring at or past
// this offset, so the writer learns it is empty and rewinds.
constexpr uint32_t kRewindAfter = 16 * 1024;

constexpr uint32_t encode(Op op, uint32_t msgs, uint32_t value) noexcept {
  return (static_cast<uint32_t>(op) << kOpShift) | ((msgs & kMsgMask) << kMsgShift) |
         (value & kValueMask);
}
constexpr uint32_t op_bits(uint32_t imm) noexcept { return imm >> kOpShift; }
constexpr uint32_t msgs_of(uint32_t imm) noexcept {
  return (imm >> kMsgShift) & kMsgMask;
}
constexpr uint32_t value_of(uint32_t imm) noexcept { return imm & kValueMask; }

// Connection private data, both directions (little-endian, 48 bytes).
struct Hello {
  static constexpr uint32_t kMagic = 0x314b5352;  // "RSK1"
  // 2: DATA records (SEND_WITH_IMM of <= record_max bytes into posted
  // receive buffers); a version-1 peer posts zero-length receives.
  static constexpr uint8_t kVersion = 2;
  // Byte 5: features; a peer without them sends 0 there.
  static constexpr uint8_t kFeatureRewind = 1;  // sends and accepts kRewind
  static constexpr size_t kSize = 16 + RemoteRegion::kSerializedSize;
  static constexpr rdmakit::detail::HelloFrame<uint8_t> kFrame{
      kMagic, kVersion, kSize, rdmakit::detail::HelloSize::kAtLeast};
  uint16_t recv_credits = 0;
  uint8_t features = kFeatureRewind;
  // Byte 8: the largest DATA record the sender of the hello accepts (its
  // record receive buffers); 0: send it no records.
  uint8_t record_max = kRecordData;
  RemoteRegion ring;

  void serialize(std::span<std::byte, kSize> out) const noexcept {
    std::memset(out.data(), 0, kSize);
    kFrame.put(out.data());
    out[5] = std::byte{features};
    std::memcpy(out.data() + 6, &recv_credits, 2);
    out[8] = std::byte{record_max};
    ring.serialize(out.subspan<16, RemoteRegion::kSerializedSize>());
  }
  // nullopt for anything that is not a well-formed hello within limits.
  static std::optional<Hello> parse(std::span<const std::byte> in) noexcept {
    if (!kFrame.check(in)) return std::nullopt;
    Hello h;
    std::memcpy(&h.recv_credits, in.data() + 6, 2);
    h.features = static_cast<uint8_t>(in[5]);
    h.record_max = static_cast<uint8_t>(in[8]);
    auto ring = RemoteRegion::deserialize(in.subspan(16, RemoteRegion::kSerializedSize));
    if (!ring) return std::nullopt;
    h.ring = *ring;
    if (h.recv_credits < kMinCredits || h.recv_credits > kMaxCredits) return std::nullopt;
    if (h.ring.length < kMinRing || h.ring.length > kMaxRing) return std::nullopt;
    if ((h.ring.access & kAccessRemoteWrite) == 0) return std::nullopt;
    return h;
  }
};
static_assert(Hello::kSize <= 192, "fits the core's private data");

// Receive-side and credit accounting of one stream: what the peer may send
// and what it has told us. Pure arithmetic, so the fuzzer drives it with
// arbitrary (imm, byte_len) records. Every accept keeps the invariants
//   rx_read <= rx_written <= rx_read + rx_size
//   peer_consumed <= tx_sent,  msg_credits <= peer_credits.
struct Flow {
  uint32_t rx_size = 0;
  uint64_t rx_written = 0;               // bytes the peer put in our ring
  uint64_t rx_read = 0;                  // bytes the application consumed
  uint64_t rx_acked = 0;                 // consumed bytes reported to the peer
  uint32_t rx_unreported = 0;            // receives reposted, not yet reported
  uint32_t rx_record_max = kRecordData;  // our hello's record_max, <= kRecordData

  uint32_t peer_ring = 0;
  uint32_t peer_credits = 0;   // receives the peer posts
  uint64_t tx_sent = 0;        // bytes written into the peer's ring
  uint64_t peer_consumed = 0;  // bytes the peer reported consumed
  uint32_t msg_credits = 0;    // messages we may still send
  bool peer_rewinds = false;   // peer's hello has kFeatureRewind

  bool fin_received = false;
  bool rst_received = false;

  enum class Result { kOk, kViolation };

  // One received message (record: it came as a SEND carrying its bytes,
  // not as a WRITE into the ring). Returns kViolation for a message no
  // honest peer sends: then nothing was changed and the stream must be
  // failed.
  Result on_message(uint32_t imm, uint32_t byte_len, bool record = false) noexcept {
    const uint32_t msgs = msgs_of(imm);
    const uint32_t value = value_of(imm);
    if (static_cast<uint64_t>(msg_credits) + msgs > peer_credits)
      return Result::kViolation;
    // Only DATA rides in a record, and at most what a receive buffer holds.
    if (record && op_bits(imm) != static_cast<uint32_t>(Op::kData))
      return Result::kViolation;
    switch (op_bits(imm)) {
      case static_cast<uint32_t>(Op::kData): {
        const bool rewind = (value & kRewind) != 0;
        const uint32_t len = value & ~kRewind;
        if (byte_len != len || len == 0) return Result::kViolation;
        if (fin_received) return Result::kViolation;
        if (record && len > rx_record_max) return Result::kViolation;
        // A rewind is honest only when everything received was read and
        // credited back: the writer saw its credits for all of it.
        uint64_t skip = 0;
        if (rewind) {
          if (rx_read != rx_written || rx_acked != rx_read) return Result::kViolation;
          skip = (rx_size - rx_written % rx_size) % rx_size;
        }
        if (rx_written + len - rx_read > rx_size)
          return Result::kViolation;  // skip cancels
        rx_written += skip + len;
        rx_read += skip;
        rx_acked += skip;
        break;
      }
      case static_cast<uint32_t>(Op::kCredit):
        if (byte_len != 0) return Result::kViolation;
        if (peer_consumed + value > tx_sent) return Result::kViolation;
        peer_consumed += value;
        break;
      case static_cast<uint32_t>(Op::kCtrl):
        if (byte_len != 0) return Result::kViolation;
        if (value == kFin) {
          if (fin_received) return Result::kViolation;
          fin_received = true;
        } else if (value == kRst) {
          rst_received = true;
        } else if (value != kKeepalive) {
          return Result::kViolation;
        }
        break;
      default: return Result::kViolation;
    }
    msg_credits += msgs;
    return Result::kOk;
  }

  uint64_t available() const noexcept { return rx_written - rx_read; }
  uint64_t peer_room() const noexcept { return peer_consumed + peer_ring - tx_sent; }
  // kRewind when the next DATA should start at the peer's ring's beginning
  // (its ring is empty by our credits and we are not there), else 0. The
  // sender then writes at offset 0 and calls rewind() once it posted.
  uint32_t rewind_due() const noexcept {
    return peer_rewinds && tx_sent == peer_consumed && tx_sent % peer_ring != 0 ? kRewind
                                                                                : 0;
  }
  void rewind() noexcept {
    const uint64_t skip = peer_ring - tx_sent % peer_ring;
    tx_sent += skip;
    peer_consumed += skip;
  }
  // The reader emptied its ring past kRewindAfter: an early CREDIT lets a
  // rewinding writer come back to the start.
  bool empty_credit_due() const noexcept {
    return peer_rewinds && rx_read == rx_written && rx_read != rx_acked &&
           rx_read % rx_size >= kRewindAfter;
  }
  uint32_t take_unreported() noexcept {
    const uint32_t n = rx_unreported;
    rx_unreported = 0;
    return n;
  }
};

// Copies a record's bytes (already accepted by Flow::on_message, which
// advanced rx_written by len from `at`) into the ring at the receiver's own
// position, split at the ring's end. len <= rx_record_max <= kRecordData <=
// kMinRing.
inline void place_record(std::byte* ring, uint32_t ring_size, uint64_t at,
                         const std::byte* src, uint32_t len) noexcept {
  const auto off = static_cast<uint32_t>(at % ring_size);
  const uint32_t first = len < ring_size - off ? len : ring_size - off;
  // Flow::on_message bounded len by rx_record_max <= kRecordData.
  rdmakit::detail::small_copy<kRecordData>(ring + off, src, first);
  if (first < len)
    rdmakit::detail::small_copy<kRecordData>(ring, src + first, len - first);
}
static_assert(kRecordData <= kMinRing);

}  // namespace rdmakit::stream::wire
