#pragma once
// The kv's messages (one SEND each way per request; GET by READ bypasses
// them). Kept apart from the transport so they can move onto another one.
//
//   request:  RequestHeader (24 B) | key (key_len) | value (value_len)
//   response: ResponseHeader (24 B) | payload (payload_len): the value of a
//             GET, the TableInfo of a TABLE, the reason text of an error.
// Fields are little-endian (the layouts are copied as they are; static_assert
// below). A client has at most kMaxOutstanding requests in flight.
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "table_layout.hpp"

namespace rdmakit::kv {

static_assert(std::endian::native == std::endian::little,
              "wire layouts are little-endian");

inline constexpr uint32_t kRequestMagic = 0x3151564bu;   // "KVQ1"
inline constexpr uint32_t kResponseMagic = 0x3152564bu;  // "KVR1"
inline constexpr uint32_t kMaxOutstanding = 4;

enum class Op : uint8_t { kPut = 1, kGet = 2, kDel = 3, kTable = 4 };

enum class KvStatus : uint8_t {
  kOk = 0,
  kNotFound,
  kKeyTooLong,    // > kMaxKey, or empty
  kValueTooLong,  // > kMaxValue
  kTableFull,     // payload says why
  kMalformed,     // header and length disagree, bad magic; payload says why
  kUnknownOp,
};
const char* kv_status_name(KvStatus status) noexcept;
const char* op_name(Op op) noexcept;

struct RequestHeader {
  uint32_t magic;
  uint8_t op;
  uint8_t reserved;
  uint16_t key_len;
  uint32_t value_len;
  uint32_t reserved2;
  uint64_t id;  // echoed in the response
};
static_assert(sizeof(RequestHeader) == 24);

struct ResponseHeader {
  uint32_t magic;
  uint8_t op;
  uint8_t status;  // KvStatus
  uint16_t reserved;
  uint32_t payload_len;
  uint32_t epoch;  // the server's current table epoch
  uint64_t id;
};
static_assert(sizeof(ResponseHeader) == 24);

inline constexpr size_t kMaxRequest = sizeof(RequestHeader) + kMaxKey + kMaxValue;
inline constexpr size_t kMaxResponse = sizeof(ResponseHeader) + kMaxValue;

struct Request {
  Op op;
  uint64_t id;
  std::string_view key;
  std::string_view value;
};

// Writes a request into out (>= sizeof(RequestHeader) + key + value bytes);
// returns its length.
size_t encode_request(std::span<std::byte> out, Op op, uint64_t id, std::string_view key,
                      std::string_view value) noexcept;

// Parses a received request: pure, no I/O (fuzz/kv_request_fuzzer.cpp). Every
// field is checked: magic, reserved fields zero, lengths equal to what the
// message carries and within kMaxKey / kMaxValue, a known op, no value on
// GET/DEL/TABLE and no key on TABLE. The views point into `in`. On failure returns
// nullopt and sets *status and *why (and *id when the header was readable, else 0).
std::optional<Request> parse_request(std::span<const std::byte> in, KvStatus* status,
                                     std::string* why, uint64_t* id);

size_t encode_response(std::span<std::byte> out, Op op, KvStatus status, uint32_t epoch,
                       uint64_t id, std::string_view payload) noexcept;

struct Response {
  Op op;
  KvStatus status;
  uint32_t epoch;
  uint64_t id;
  std::string_view payload;
};
std::optional<Response> parse_response(std::span<const std::byte> in) noexcept;

}  // namespace rdmakit::kv
