#pragma once
// Completion and post statuses with readable names. The completion statuses
// mirror enum ibv_wc_status one to one so the verbs provider maps without loss.
#include <cstdint>

#include "rdmakit/export.hpp"

namespace rdmakit {

enum class Status : uint8_t {
  kSuccess = 0,
  kLocalLengthError,           // IBV_WC_LOC_LEN_ERR
  kLocalQpOperationError,      // IBV_WC_LOC_QP_OP_ERR
  kLocalProtectionError,       // IBV_WC_LOC_PROT_ERR: bad lkey or local range
  kWrFlushError,               // IBV_WC_WR_FLUSH_ERR: QP was in error
  kBadResponseError,           // IBV_WC_BAD_RESP_ERR
  kLocalAccessError,           // IBV_WC_LOC_ACCESS_ERR
  kRemoteInvalidRequestError,  // IBV_WC_REM_INV_REQ_ERR: e.g. SEND > RECV
  kRemoteAccessError,          // IBV_WC_REM_ACCESS_ERR: rkey/range/permission
  kRemoteOperationError,       // IBV_WC_REM_OP_ERR
  kRetryExceeded,              // IBV_WC_RETRY_EXC_ERR: peer dead / unreachable
  kRnrRetryExceeded,           // IBV_WC_RNR_RETRY_EXC_ERR: no RECV posted
  kFatalError,                 // IBV_WC_FATAL_ERR
  kResponseTimeout,            // IBV_WC_RESP_TIMEOUT_ERR
  kGeneralError,               // IBV_WC_GENERAL_ERR
};

// "SUCCESS", "REMOTE_ACCESS_ERROR", ... Never null.
RDMAKIT_API const char* status_name(Status status) noexcept;

// Result of posting work requests (the errno of ibv_post_send, typed).
enum class PostStatus : uint8_t {
  kOk = 0,
  kQueueFull,        // more outstanding requests than max_send_wr/max_recv_wr
  kInvalidArgument,  // malformed request (bad opcode, atomic length != 8, ...)
  kInlineTooLarge,   // INLINE payload larger than the QP's max_inline
  kWrongThread,      // posted from a thread that does not own a single-owner QP
  kNotConnected,     // QP was never connected or has been destroyed
};

RDMAKIT_API const char* post_status_name(PostStatus status) noexcept;

struct PostResult {
  PostStatus status = PostStatus::kOk;
  uint32_t posted = 0;  // requests accepted before the first failure
  [[nodiscard]] bool ok() const noexcept { return status == PostStatus::kOk; }
};

}  // namespace rdmakit
