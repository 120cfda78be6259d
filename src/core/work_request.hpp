#pragma once
// Opcode classes and the post-time check of a send work request, shared by
// every provider so that all of them accept and refuse the same requests.
//
// Refused at post (PostStatus, nothing queued), as ibv_post_send does:
//  - an opcode that is not a send opcode (kRecv, kRecvWriteWithImm, junk);
//  - an atomic whose length is not 8, or whose remote address is not 8-byte
//    aligned (rxe refuses it in ibv_post_send with EINVAL; other devices
//    complete it REMOTE_INVALID_REQUEST_ERROR and break the QP: checking it
//    here makes every provider and every device agree, and the requester
//    has all it needs to check);
//  - kInline on a request that carries no outgoing payload (READ, atomics):
//    inline describes the source of the bytes sent, a sink has none;
//  - an inline payload larger than the QP's max_inline (kInlineTooLarge).
// What only the responder knows (rkey, range, permission) completes with an
// error status, as on a NIC; responders still refuse a misaligned atomic
// from a peer that skipped this check. Local keys are checked at execution
// and complete with kLocalProtectionError.
#include <cstdint>

#include "rdmakit/status.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit::core {

// SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ and the atomics.
constexpr bool is_send_opcode(Opcode op) noexcept {
  return static_cast<uint8_t>(op) <= static_cast<uint8_t>(Opcode::kFetchAdd);
}
constexpr bool is_atomic(Opcode op) noexcept {
  return op == Opcode::kCompareSwap || op == Opcode::kFetchAdd;
}
// Carries a payload from the local buffer to the peer (the buffer is a source).
constexpr bool is_send_op(Opcode op) noexcept {
  return op == Opcode::kSend || op == Opcode::kSendWithImm || op == Opcode::kWrite ||
         op == Opcode::kWriteWithImm;
}
// Writes into the local buffer (READ data, an atomic's old value).
constexpr bool is_sink(Opcode op) noexcept {
  return op == Opcode::kRead || is_atomic(op);
}
// Consumes a RECV at the responder.
constexpr bool consumes_recv(Opcode op) noexcept {
  return op == Opcode::kSend || op == Opcode::kSendWithImm || op == Opcode::kWriteWithImm;
}
constexpr bool has_imm(Opcode op) noexcept {
  return op == Opcode::kSendWithImm || op == Opcode::kWriteWithImm;
}
// Atomics act on one naturally aligned 8-byte word.
inline constexpr uint32_t kAtomicLength = 8;
constexpr bool atomic_aligned(uint64_t remote_addr) noexcept {
  return remote_addr % kAtomicLength == 0;
}

// The post-time check above; kOk if the request may be queued.
constexpr PostStatus validate_send(const SendWr& wr, uint32_t max_inline) noexcept {
  if (!is_send_opcode(wr.opcode)) return PostStatus::kInvalidArgument;
  if (is_atomic(wr.opcode) &&
      (wr.length != kAtomicLength || !atomic_aligned(wr.remote_addr))) {
    return PostStatus::kInvalidArgument;
  }
  if ((wr.flags & kInline) != 0) {
    if (!is_send_op(wr.opcode)) return PostStatus::kInvalidArgument;
    if (wr.length > max_inline) return PostStatus::kInlineTooLarge;
  }
  return PostStatus::kOk;
}

}  // namespace rdmakit::core
