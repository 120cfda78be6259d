#pragma once
// Work requests and completions. Layouts are plain structs so a provider can
// translate them to ibv_send_wr / ibv_wc without allocation.
#include <cstdint>

#include "rdmakit/export.hpp"
#include "rdmakit/status.hpp"

namespace rdmakit {

// Memory access rights (IBV_ACCESS_*).
enum Access : uint32_t {
  kAccessLocalWrite = 1u << 0,
  kAccessRemoteWrite = 1u << 1,
  kAccessRemoteRead = 1u << 2,
  kAccessRemoteAtomic = 1u << 3,
  kAccessAll =
      kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic,
};

enum class Opcode : uint8_t {
  kSend = 0,
  kSendWithImm,
  kWrite,
  kWriteWithImm,
  kRead,
  kCompareSwap,
  kFetchAdd,
  // Receive-side completion opcodes.
  kRecv,              // consumed by SEND / SEND_WITH_IMM
  kRecvWriteWithImm,  // consumed by WRITE_WITH_IMM (byte_len = bytes written)
};

RDMAKIT_API const char* opcode_name(Opcode opcode) noexcept;

// SendWr::flags.
enum SendFlags : uint8_t {
  kSignaled = 1u << 0,  // generate a completion (selective signaling)
  kInline = 1u << 1,    // payload copied at post: buffer reusable at once, lkey ignored
  kFence = 1u << 2,     // wait for earlier READ/atomics before executing
};

struct SendWr {
  uint64_t wr_id = 0;  // caller's cookie, returned untouched
  Opcode opcode = Opcode::kSend;
  uint8_t flags = 0;           // SendFlags
  uint32_t length = 0;         // bytes; 8 for atomics
  void* local_addr = nullptr;  // source (SEND/WRITE) or sink (READ, atomic old value)
  uint32_t lkey = 0;
  uint32_t imm = 0;          // for *_WITH_IMM, host byte order
  uint64_t remote_addr = 0;  // WRITE/READ/atomics
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // CAS: compare value; FETCH_ADD: addend
  uint64_t swap = 0;         // CAS: new value
};

struct RecvWr {
  uint64_t wr_id = 0;
  void* addr = nullptr;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

enum CompletionFlags : uint8_t {
  kCompletionHasImm = 1u << 0,
};

struct Completion {
  uint64_t wr_id = 0;
  uint32_t byte_len = 0;  // receive side: bytes received / written
  uint32_t imm = 0;       // valid when flags & kCompletionHasImm
  uint32_t qp_num = 0;    // local QP that produced it (for shared CQs)
  Opcode opcode = Opcode::kSend;
  Status status = Status::kSuccess;
  uint8_t flags = 0;
  uint8_t reserved = 0;
  uint32_t vendor_err = 0;  // provider-specific detail (verbs: wc.vendor_err)

  [[nodiscard]] bool ok() const noexcept { return status == Status::kSuccess; }
  [[nodiscard]] bool has_imm() const noexcept { return (flags & kCompletionHasImm) != 0; }
};
static_assert(sizeof(Completion) == 32, "Completion stays two per cache line");

}  // namespace rdmakit
