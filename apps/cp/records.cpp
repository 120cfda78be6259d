// A state on the stack (no allocation per slot) needs the static API.
#define XXH_STATIC_LINKING_ONLY
#include "records.hpp"

#include <xxhash.h>

#include <cstring>

#include "protocol.hpp"

namespace rdmakit::cp {

namespace {

// Skips a record's fields after its type; returns the data length that
// follows (data records) or 0; false on a short or unknown record.
bool skip_record(Reader& rd, Rec type, uint32_t* data_len) {
  *data_len = 0;
  switch (type) {
    case Rec::kEntry:
      rd.take(4 + 1 + 4 + 8 + 4 + 8);
      rd.str(4096);
      rd.str(4096);
      break;
    case Rec::kData: {
      rd.take(4 + 8);
      *data_len = rd.get<uint32_t>();
      rd.take(8);
      break;
    }
    case Rec::kEnd: rd.take(4 + 8); break;
    case Rec::kAbort:
      rd.take(4);
      rd.str(4096);
      break;
    default: return false;
  }
  return rd.ok();
}

}  // namespace

uint64_t records_hash(std::span<const std::byte> payload, bool* ok) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  Reader rd(payload);
  size_t span_start = 0;  // hashed bytes since the last data bytes
  *ok = false;
  while (!rd.at_end()) {
    const auto type = static_cast<Rec>(rd.get<uint8_t>());
    uint32_t len = 0;
    if (!rd.ok() || !skip_record(rd, type, &len)) return 0;
    if (len == 0) continue;
    const size_t data_at = payload.size() - rd.left();
    if (rd.left() < len) return 0;
    XXH3_64bits_update(&state, payload.data() + span_start, data_at - span_start);
    rd.take(len);
    span_start = data_at + len;
  }
  XXH3_64bits_update(&state, payload.data() + span_start, payload.size() - span_start);
  *ok = true;
  return XXH3_64bits_digest(&state);
}

}  // namespace rdmakit::cp
