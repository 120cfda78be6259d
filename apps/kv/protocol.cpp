#include "protocol.hpp"

#include "fmt/format.h"

namespace rdmakit::kv {
namespace {

// memcpy with an empty view (whose data() may be null) is undefined.
void copy_bytes(std::byte* to, std::string_view from) {
  if (!from.empty()) std::memcpy(to, from.data(), from.size());
}

}  // namespace

const char* kv_status_name(KvStatus status) noexcept {
  switch (status) {
    case KvStatus::kOk: return "OK";
    case KvStatus::kNotFound: return "NOT_FOUND";
    case KvStatus::kKeyTooLong: return "KEY_TOO_LONG";
    case KvStatus::kValueTooLong: return "VALUE_TOO_LONG";
    case KvStatus::kTableFull: return "TABLE_FULL";
    case KvStatus::kMalformed: return "MALFORMED_REQUEST";
    case KvStatus::kUnknownOp: return "UNKNOWN_OP";
  }
  return "UNKNOWN_STATUS";
}

const char* op_name(Op op) noexcept {
  switch (op) {
    case Op::kPut: return "PUT";
    case Op::kGet: return "GET";
    case Op::kDel: return "DEL";
    case Op::kTable: return "TABLE";
  }
  return "UNKNOWN_OP";
}

size_t encode_request(std::span<std::byte> out, Op op, uint64_t id, std::string_view key,
                      std::string_view value) noexcept {
  RequestHeader h{};
  h.magic = kRequestMagic;
  h.op = static_cast<uint8_t>(op);
  h.key_len = static_cast<uint16_t>(key.size());
  h.value_len = static_cast<uint32_t>(value.size());
  h.id = id;
  std::memcpy(out.data(), &h, sizeof h);
  copy_bytes(out.data() + sizeof h, key);
  copy_bytes(out.data() + sizeof h + key.size(), value);
  return sizeof h + key.size() + value.size();
}

std::optional<Request> parse_request(std::span<const std::byte> in, KvStatus* status,
                                     std::string* why, uint64_t* id) {
  *id = 0;
  *status = KvStatus::kMalformed;
  RequestHeader h;
  if (in.size() < sizeof h) {
    *why = fmt::format("request of {} bytes is shorter than its {}-byte header",
                       in.size(), sizeof h);
    return std::nullopt;
  }
  std::memcpy(&h, in.data(), sizeof h);
  if (h.magic != kRequestMagic) {
    *why = fmt::format("bad request magic {:#010x}", h.magic);
    return std::nullopt;
  }
  *id = h.id;
  const size_t want = sizeof h + size_t{h.key_len} + h.value_len;
  if (want != in.size()) {
    *why = fmt::format(
        "request says key {} B + value {} B but carries {} B after the header", h.key_len,
        h.value_len, in.size() - sizeof h);
    return std::nullopt;
  }
  if (h.reserved != 0 || h.reserved2 != 0) {
    *why = fmt::format("reserved header fields are not zero ({:#x}, {:#x})", h.reserved,
                       h.reserved2);
    return std::nullopt;
  }
  const Op op = static_cast<Op>(h.op);
  if (op != Op::kPut && op != Op::kGet && op != Op::kDel && op != Op::kTable) {
    *status = KvStatus::kUnknownOp;
    *why = fmt::format("unknown op {}", h.op);
    return std::nullopt;
  }
  if (op != Op::kTable && (h.key_len == 0 || h.key_len > kMaxKey)) {
    *status = KvStatus::kKeyTooLong;
    *why = fmt::format("key of {} bytes (1..{} allowed)", h.key_len, kMaxKey);
    return std::nullopt;
  }
  if (h.value_len > kMaxValue) {
    *status = KvStatus::kValueTooLong;
    *why = fmt::format("value of {} bytes (at most {})", h.value_len, kMaxValue);
    return std::nullopt;
  }
  if (op == Op::kTable && h.key_len != 0) {
    *why = fmt::format("TABLE carries a {}-byte key", h.key_len);
    return std::nullopt;
  }
  if (op != Op::kPut && h.value_len != 0) {
    *why = fmt::format("{} carries a {}-byte value", op_name(op), h.value_len);
    return std::nullopt;
  }
  *status = KvStatus::kOk;
  const char* p = reinterpret_cast<const char*>(in.data()) + sizeof h;
  return Request{op, h.id, {p, h.key_len}, {p + h.key_len, h.value_len}};
}

size_t encode_response(std::span<std::byte> out, Op op, KvStatus status, uint32_t epoch,
                       uint64_t id, std::string_view payload) noexcept {
  ResponseHeader h{};
  h.magic = kResponseMagic;
  h.op = static_cast<uint8_t>(op);
  h.status = static_cast<uint8_t>(status);
  h.payload_len = static_cast<uint32_t>(payload.size());
  h.epoch = epoch;
  h.id = id;
  std::memcpy(out.data(), &h, sizeof h);
  copy_bytes(out.data() + sizeof h, payload);
  return sizeof h + payload.size();
}

std::optional<Response> parse_response(std::span<const std::byte> in) noexcept {
  ResponseHeader h;
  if (in.size() < sizeof h) return std::nullopt;
  std::memcpy(&h, in.data(), sizeof h);
  if (h.magic != kResponseMagic || sizeof h + size_t{h.payload_len} != in.size())
    return std::nullopt;
  return Response{static_cast<Op>(h.op),
                  static_cast<KvStatus>(h.status),
                  h.epoch,
                  h.id,
                  {reinterpret_cast<const char*>(in.data()) + sizeof h, h.payload_len}};
}

}  // namespace rdmakit::kv
