// Every enumerator has its own readable name.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit {
namespace {

TEST(NamesTest, StatusNames) {
  const std::vector<std::pair<Status, std::string>> expected = {
      {Status::kSuccess, "SUCCESS"},
      {Status::kLocalLengthError, "LOCAL_LENGTH_ERROR"},
      {Status::kLocalQpOperationError, "LOCAL_QP_OPERATION_ERROR"},
      {Status::kLocalProtectionError, "LOCAL_PROTECTION_ERROR"},
      {Status::kWrFlushError, "WR_FLUSH_ERROR"},
      {Status::kBadResponseError, "BAD_RESPONSE_ERROR"},
      {Status::kLocalAccessError, "LOCAL_ACCESS_ERROR"},
      {Status::kRemoteInvalidRequestError, "REMOTE_INVALID_REQUEST_ERROR"},
      {Status::kRemoteAccessError, "REMOTE_ACCESS_ERROR"},
      {Status::kRemoteOperationError, "REMOTE_OPERATION_ERROR"},
      {Status::kRetryExceeded, "RETRY_EXCEEDED"},
      {Status::kRnrRetryExceeded, "RNR_RETRY_EXCEEDED"},
      {Status::kFatalError, "FATAL_ERROR"},
      {Status::kResponseTimeout, "RESPONSE_TIMEOUT"},
      {Status::kGeneralError, "GENERAL_ERROR"},
  };
  // The list covers the enum densely (the values mirror ibv_wc_status).
  ASSERT_EQ(expected.size(), static_cast<size_t>(Status::kGeneralError) + 1);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(expected[i].first), i);
    EXPECT_STREQ(status_name(expected[i].first), expected[i].second.c_str());
  }
  const char* unknown = status_name(static_cast<Status>(200));
  ASSERT_NE(unknown, nullptr);
  EXPECT_GT(std::strlen(unknown), 0u);
}

TEST(NamesTest, OpcodeNames) {
  const std::vector<std::pair<Opcode, std::string>> expected = {
      {Opcode::kSend, "SEND"},
      {Opcode::kSendWithImm, "SEND_WITH_IMM"},
      {Opcode::kWrite, "WRITE"},
      {Opcode::kWriteWithImm, "WRITE_WITH_IMM"},
      {Opcode::kRead, "READ"},
      {Opcode::kCompareSwap, "COMPARE_SWAP"},
      {Opcode::kFetchAdd, "FETCH_ADD"},
      {Opcode::kRecv, "RECV"},
      {Opcode::kRecvWriteWithImm, "RECV_WRITE_WITH_IMM"},
  };
  ASSERT_EQ(expected.size(), static_cast<size_t>(Opcode::kRecvWriteWithImm) + 1);
  for (const auto& [opcode, name] : expected) {
    EXPECT_STREQ(opcode_name(opcode), name.c_str());
  }
  ASSERT_NE(opcode_name(static_cast<Opcode>(200)), nullptr);
}

TEST(NamesTest, PostStatusNames) {
  const std::vector<std::pair<PostStatus, std::string>> expected = {
      {PostStatus::kOk, "OK"},
      {PostStatus::kQueueFull, "QUEUE_FULL"},
      {PostStatus::kInvalidArgument, "INVALID_ARGUMENT"},
      {PostStatus::kInlineTooLarge, "INLINE_TOO_LARGE"},
      {PostStatus::kWrongThread, "WRONG_THREAD"},
      {PostStatus::kNotConnected, "NOT_CONNECTED"},
  };
  ASSERT_EQ(expected.size(), static_cast<size_t>(PostStatus::kNotConnected) + 1);
  for (const auto& [status, name] : expected) {
    EXPECT_STREQ(post_status_name(status), name.c_str());
  }
  ASSERT_NE(post_status_name(static_cast<PostStatus>(200)), nullptr);
}

TEST(NamesTest, QpStateAndProviderNames) {
  EXPECT_STREQ(qp_state_name(QpState::kConnected), "CONNECTED");
  EXPECT_STREQ(qp_state_name(QpState::kError), "ERROR");
  EXPECT_STREQ(qp_state_name(QpState::kClosed), "CLOSED");
  EXPECT_STREQ(provider_name(ProviderKind::kAuto), "auto");
  EXPECT_STREQ(provider_name(ProviderKind::kShm), "shm");
  EXPECT_STREQ(provider_name(ProviderKind::kTcp), "tcp");
  EXPECT_STREQ(provider_name(ProviderKind::kVerbs), "verbs");
}

TEST(NamesTest, NamesAreDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i <= static_cast<int>(Status::kGeneralError); ++i) {
    EXPECT_TRUE(seen.insert(status_name(static_cast<Status>(i))).second) << i;
  }
  seen.clear();
  for (int i = 0; i <= static_cast<int>(Opcode::kRecvWriteWithImm); ++i) {
    EXPECT_TRUE(seen.insert(opcode_name(static_cast<Opcode>(i))).second) << i;
  }
}

}  // namespace
}  // namespace rdmakit
