// Readable names for statuses, opcodes and states.
#include "rdmakit/context.hpp"
#include "rdmakit/queue_pair.hpp"
#include "rdmakit/status.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit {

const char* status_name(Status status) noexcept {
  switch (status) {
    case Status::kSuccess: return "SUCCESS";
    case Status::kLocalLengthError: return "LOCAL_LENGTH_ERROR";
    case Status::kLocalQpOperationError: return "LOCAL_QP_OPERATION_ERROR";
    case Status::kLocalProtectionError: return "LOCAL_PROTECTION_ERROR";
    case Status::kWrFlushError: return "WR_FLUSH_ERROR";
    case Status::kBadResponseError: return "BAD_RESPONSE_ERROR";
    case Status::kLocalAccessError: return "LOCAL_ACCESS_ERROR";
    case Status::kRemoteInvalidRequestError: return "REMOTE_INVALID_REQUEST_ERROR";
    case Status::kRemoteAccessError: return "REMOTE_ACCESS_ERROR";
    case Status::kRemoteOperationError: return "REMOTE_OPERATION_ERROR";
    case Status::kRetryExceeded: return "RETRY_EXCEEDED";
    case Status::kRnrRetryExceeded: return "RNR_RETRY_EXCEEDED";
    case Status::kFatalError: return "FATAL_ERROR";
    case Status::kResponseTimeout: return "RESPONSE_TIMEOUT";
    case Status::kGeneralError: return "GENERAL_ERROR";
  }
  return "UNKNOWN_STATUS";
}

const char* post_status_name(PostStatus status) noexcept {
  switch (status) {
    case PostStatus::kOk: return "OK";
    case PostStatus::kQueueFull: return "QUEUE_FULL";
    case PostStatus::kInvalidArgument: return "INVALID_ARGUMENT";
    case PostStatus::kInlineTooLarge: return "INLINE_TOO_LARGE";
    case PostStatus::kWrongThread: return "WRONG_THREAD";
    case PostStatus::kNotConnected: return "NOT_CONNECTED";
  }
  return "UNKNOWN_POST_STATUS";
}

const char* opcode_name(Opcode opcode) noexcept {
  switch (opcode) {
    case Opcode::kSend: return "SEND";
    case Opcode::kSendWithImm: return "SEND_WITH_IMM";
    case Opcode::kWrite: return "WRITE";
    case Opcode::kWriteWithImm: return "WRITE_WITH_IMM";
    case Opcode::kRead: return "READ";
    case Opcode::kCompareSwap: return "COMPARE_SWAP";
    case Opcode::kFetchAdd: return "FETCH_ADD";
    case Opcode::kRecv: return "RECV";
    case Opcode::kRecvWriteWithImm: return "RECV_WRITE_WITH_IMM";
  }
  return "UNKNOWN_OPCODE";
}

const char* qp_state_name(QpState state) noexcept {
  switch (state) {
    case QpState::kConnected: return "CONNECTED";
    case QpState::kError: return "ERROR";
    case QpState::kClosed: return "CLOSED";
  }
  return "UNKNOWN_STATE";
}

const char* provider_name(ProviderKind kind) noexcept {
  switch (kind) {
    case ProviderKind::kAuto: return "auto";
    case ProviderKind::kShm: return "shm";
    case ProviderKind::kTcp: return "tcp";
    case ProviderKind::kVerbs: return "verbs";
  }
  return "unknown";
}

}  // namespace rdmakit
