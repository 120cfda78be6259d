#pragma once
// tcp provider wire format. Every frame is a fixed 48-byte little-endian
// header followed by `length` payload bytes:
//   0  u8  opcode      (WireOp)
//   1  u8  status      (NAK only: rdmakit::Status; else 0)
//   2  u16 reserved    (0)
//   4  u32 length      payload bytes that follow the header
//   8  u64 seq         request sequence number; responses echo it
//   16 u64 addr        remote address (WRITE/READ/atomics)
//   24 u32 rkey
//   28 u32 imm
//   32 u64 arg0        READ: bytes to read; CAS: compare; FADD: addend;
//                      ATOMIC_RESP: old value
//   40 u64 arg1        CAS: swap
// The decoder treats the bytes as hostile: unknown opcodes, non-zero reserved
// fields, lengths an opcode cannot carry and unknown statuses are rejected, so
// the queue pair above only ever sees frames whose shape is valid. Whether an
// address/rkey is acceptable is decided later, against the region table.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "core/little_endian.hpp"
#include "rdmakit/detail/hello_frame.hpp"
#include "rdmakit/status.hpp"

namespace rdmakit::tcp {

inline constexpr size_t kHeaderSize = 48;
// Largest payload one frame may announce (SEND/WRITE/READ). Bounded so a
// hostile length can never ask for more than the API can express.
inline constexpr uint32_t kMaxPayload = 1u << 31;
inline constexpr uint32_t kHelloMagic = 0x43544b52;  // "RKTC"
inline constexpr uint16_t kWireVersion = 1;

enum class WireOp : uint8_t {
  kHello = 0x01,  // handshake only (connect/accept), never in the QP stream
  kSend = 0x10,
  kSendWithImm = 0x11,
  kWrite = 0x12,
  kWriteWithImm = 0x13,
  kReadReq = 0x14,
  kCompareSwap = 0x15,
  kFetchAdd = 0x16,
  kAck = 0x20,         // cumulative: every request up to and including seq
  kNak = 0x21,         // request seq failed with status; earlier ones succeeded
  kReadResp = 0x22,    // payload = the data read
  kAtomicResp = 0x23,  // arg0 = the old value
  kHeartbeat = 0x30,   // liveness only
};

struct Header {
  WireOp op = WireOp::kHeartbeat;
  Status status = Status::kSuccess;
  uint32_t length = 0;
  uint64_t seq = 0;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;
  uint64_t arg0 = 0;
  uint64_t arg1 = 0;
};

inline bool is_request(WireOp op) noexcept {
  return static_cast<uint8_t>(op) >= 0x10 && static_cast<uint8_t>(op) <= 0x16;
}
inline bool is_response(WireOp op) noexcept {
  return static_cast<uint8_t>(op) >= 0x20 && static_cast<uint8_t>(op) <= 0x23;
}

inline void encode_header(const Header& h, std::byte* out) noexcept {
  out[0] = static_cast<std::byte>(h.op);
  out[1] = static_cast<std::byte>(h.status);
  core::put_le<uint16_t>(out + 2, 0);
  core::put_le<uint32_t>(out + 4, h.length);
  core::put_le<uint64_t>(out + 8, h.seq);
  core::put_le<uint64_t>(out + 16, h.addr);
  core::put_le<uint32_t>(out + 24, h.rkey);
  core::put_le<uint32_t>(out + 28, h.imm);
  core::put_le<uint64_t>(out + 32, h.arg0);
  core::put_le<uint64_t>(out + 40, h.arg1);
}

// Statuses a peer may legitimately report in a NAK.
inline bool nak_status_valid(uint8_t s) noexcept {
  switch (static_cast<Status>(s)) {
    case Status::kRemoteAccessError:
    case Status::kRemoteInvalidRequestError:
    case Status::kRemoteOperationError:
    case Status::kRnrRetryExceeded:
    case Status::kRetryExceeded: return true;
    default: return false;
  }
}

// Validates the shape of one header; nullopt means a protocol violation.
inline std::optional<Header> decode_header(
    std::span<const std::byte, kHeaderSize> in) noexcept {
  const std::byte* p = in.data();
  Header h;
  const auto op = static_cast<uint8_t>(p[0]);
  const auto status = static_cast<uint8_t>(p[1]);
  if (core::get_le<uint16_t>(p + 2) != 0) return std::nullopt;
  h.length = core::get_le<uint32_t>(p + 4);
  h.seq = core::get_le<uint64_t>(p + 8);
  h.addr = core::get_le<uint64_t>(p + 16);
  h.rkey = core::get_le<uint32_t>(p + 24);
  h.imm = core::get_le<uint32_t>(p + 28);
  h.arg0 = core::get_le<uint64_t>(p + 32);
  h.arg1 = core::get_le<uint64_t>(p + 40);
  if (h.length > kMaxPayload) return std::nullopt;
  const bool has_payload = h.length != 0;
  switch (static_cast<WireOp>(op)) {
    case WireOp::kSend:
    case WireOp::kSendWithImm:
    case WireOp::kWrite:
    case WireOp::kWriteWithImm:
    case WireOp::kReadResp: break;
    case WireOp::kReadReq:
      if (has_payload || h.arg0 > kMaxPayload) return std::nullopt;
      break;
    case WireOp::kCompareSwap:
    case WireOp::kFetchAdd:
    case WireOp::kAck:
    case WireOp::kAtomicResp:
    case WireOp::kHeartbeat:
      if (has_payload) return std::nullopt;
      break;
    case WireOp::kNak:
      if (has_payload || !nak_status_valid(status)) return std::nullopt;
      h.status = static_cast<Status>(status);
      break;
    case WireOp::kHello:  // only valid during the handshake
    default: return std::nullopt;
  }
  if (static_cast<WireOp>(op) != WireOp::kNak && status != 0) return std::nullopt;
  h.op = static_cast<WireOp>(op);
  return h;
}

// Handshake body (after a kHello header whose length covers body + private
// data): both sides announce their limits so each can size its rings and
// apply the initiator's RNR budget when it is the target.
struct Hello {
  uint32_t max_send_wr = 0;
  uint32_t max_recv_wr = 0;
  uint32_t rnr_timeout_ms = 0;
  uint32_t peer_timeout_ms = 0;
  uint32_t private_len = 0;
};
inline constexpr size_t kHelloBodySize = 28;
// Magic and version first; the private data after the body is bounded below.
inline constexpr detail::HelloFrame<uint16_t> kHelloFrame{
    kHelloMagic, kWireVersion, kHelloBodySize, detail::HelloSize::kAtLeast};
inline constexpr uint32_t kMaxWr = 1u << 16;

inline void encode_hello(const Hello& h, std::byte* out) noexcept {
  kHelloFrame.put(out);
  core::put_le<uint16_t>(out + 6, 0);
  core::put_le<uint32_t>(out + 8, h.max_send_wr);
  core::put_le<uint32_t>(out + 12, h.max_recv_wr);
  core::put_le<uint32_t>(out + 16, h.rnr_timeout_ms);
  core::put_le<uint32_t>(out + 20, h.peer_timeout_ms);
  core::put_le<uint32_t>(out + 24, h.private_len);
}

// max_private bounds the private data so a peer cannot make us allocate.
inline std::optional<Hello> decode_hello(std::span<const std::byte> in,
                                         size_t max_private) noexcept {
  if (!kHelloFrame.check(in)) return std::nullopt;
  const std::byte* p = in.data();
  Hello h;
  h.max_send_wr = core::get_le<uint32_t>(p + 8);
  h.max_recv_wr = core::get_le<uint32_t>(p + 12);
  h.rnr_timeout_ms = core::get_le<uint32_t>(p + 16);
  h.peer_timeout_ms = core::get_le<uint32_t>(p + 20);
  h.private_len = core::get_le<uint32_t>(p + 24);
  if (h.max_send_wr == 0 || h.max_send_wr > kMaxWr) return std::nullopt;
  if (h.max_recv_wr == 0 || h.max_recv_wr > kMaxWr) return std::nullopt;
  if (h.peer_timeout_ms == 0) return std::nullopt;
  if (h.private_len > max_private) return std::nullopt;
  if (in.size() != kHelloBodySize + h.private_len) return std::nullopt;
  return h;
}

}  // namespace rdmakit::tcp
