// Fuzz target: what rdmakit-kv reads from a peer before it trusts anything.
// The server's request parser (apps/kv/protocol.cpp, parse_request) and the
// handshake messages (apps/kv/auth.cpp) are fed arbitrary bytes; whatever
// they accept must name only bytes inside the message, respect every limit,
// and encode back to exactly the bytes received (so no field is ignored). A
// proof that parses never verifies against a secret it was not made with.
// The client's reader of the server's table (probe_neighborhood, verify_block,
// TableInfo::deserialize) gets the same bytes as a lying server's table.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "auth.hpp"
#include "protocol.hpp"
#include "table_layout.hpp"

using namespace rdmakit::kv;

namespace {

const rdmakit::auth::Secret* fuzz_secret() {
  static const auto secret = [] {
    setenv("RDMAKIT_KV_FUZZ_SECRET", "rdmakit-kv fuzz secret 0123456789", 1);
    return rdmakit::auth::Secret::from_env("RDMAKIT_KV_FUZZ_SECRET");
  }();
  return &*secret;
}

void check(bool ok) {
  if (!ok) std::abort();
}

template <class Encoded>
void same_bytes(const Encoded& encoded, std::span<const std::byte> in) {
  check(encoded.size() == in.size() &&
        std::memcmp(encoded.data(), in.data(), in.size()) == 0);
}

void fuzz_request(std::span<const std::byte> in) {
  KvStatus status = KvStatus::kOk;
  std::string why;
  uint64_t id = 0;
  const auto r = parse_request(in, &status, &why, &id);
  if (!r) {
    check(status != KvStatus::kOk && !why.empty());
    return;
  }
  check(status == KvStatus::kOk);
  const auto* begin = reinterpret_cast<const char*>(in.data());
  const auto* end = begin + in.size();
  check(r->key.empty() ||
        (r->key.data() >= begin && r->key.data() + r->key.size() <= end));
  check(r->value.empty() ||
        (r->value.data() >= begin && r->value.data() + r->value.size() <= end));
  check(r->key.size() <= kMaxKey && r->value.size() <= kMaxValue);
  check(r->op == Op::kTable ? r->key.empty() : !r->key.empty());
  check(r->op == Op::kPut || r->value.empty());
  check(r->id == id);
  std::vector<std::byte> out(kMaxRequest);
  const size_t n = encode_request(out, r->op, r->id, r->key, r->value);
  out.resize(n);
  same_bytes(out, in);
}

void fuzz_handshake(std::span<const std::byte> in) {
  if (const auto n = parse_hello(in)) same_bytes(encode_hello(*n), in);
  if (const auto c = parse_challenge(in)) same_bytes(encode_challenge(*c), in);
  if (const auto p = parse_proof(in)) {
    same_bytes(encode_proof(*p), in);
    const rdmakit::auth::Nonce cn{}, sn{};
    const AuthStatus s = check_proof(fuzz_secret(), cn, sn, *p);
    check(s != AuthStatus::kOk);  // 2^-256
    check(check_proof(nullptr, cn, sn, *p) == AuthStatus::kOk);
  }
  if (const auto w = parse_welcome(in)) {
    check(w->table_info.size() + kWelcomeHeaderBytes == in.size());
    same_bytes(encode_welcome(w->status, w->server_proof, w->table_info), in);
  }
}

void fuzz_reader(std::span<const std::byte> in) {
  if (const auto info = TableInfo::deserialize(in)) {
    check(info->buckets != 0 && info->buckets <= kMaxDescribedBuckets);
    check(info->blocks_offset <= info->region.length);
  }
  if (const auto resp = parse_response(in)) {
    check(sizeof(ResponseHeader) + resp->payload.size() == in.size());
  }
  // The bytes as a lying server's slots, probed for the key the first slot
  // names (its key_hash and the first key bytes of its data), so that the
  // checks past the hash compare are reached.
  std::string key = "k";
  uint64_t hash = key_hash(key);
  if (in.size() >= kSlotHeader + 8) {
    const size_t len = size_t{1} + (uint8_t(in[offsetof(Slot, key_len)]) & 7);
    key.assign(reinterpret_cast<const char*>(in.data()) + kSlotHeader, len);
    std::memcpy(&hash, in.data() + offsetof(Slot, key_hash), sizeof hash);
  }
  std::string value;
  const ProbeResult p = probe_neighborhood(in, key, hash, &value);
  check(value.size() <= kMaxValue);
  if (p.probe != Probe::kRetry && p.probe != Probe::kMoved)
    check(p.reach <= kNeighborhood);
  (void)verify_block(in, key, 0, &value);
  check(value.size() <= kMaxValue);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz_secret();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A private copy: the parsers' views must point into the message, and ASan
  // catches any byte read past it.
  std::vector<std::byte> buf(size);
  if (size > 0) std::memcpy(buf.data(), data, size);
  const std::span<const std::byte> in(buf);
  fuzz_request(in);
  fuzz_handshake(in);
  fuzz_reader(in);
  return 0;
}
