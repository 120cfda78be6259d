// A state on the stack (no allocation per slot) needs the static API.
#define XXH_STATIC_LINKING_ONLY
#include "records.hpp"

#include <xxhash.h>

#include <cstring>

#include "limits.hpp"
#include "protocol.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

namespace {

// Skips a record's fields after its type; returns the data length that
// follows (data records) or 0; false on a short or unknown record.
bool skip_record(Reader& rd, Rec type, uint32_t* data_len) {
  *data_len = 0;
  switch (type) {
    case Rec::kEntry: {
      EntryRecord e;
      std::string why;
      if (parse_entry(rd, &e, &why) == Parsed::kMalformed) return false;
      break;
    }
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

namespace rdmakit::cp {

void encode_entry(const EntryRecord& e, Writer* w) {
  w->put<uint32_t>(e.id).put<uint8_t>(e.kind).put<uint32_t>(e.mode);
  w->put<int64_t>(e.sec).put<uint32_t>(e.nsec).put<uint64_t>(e.size);
  w->str(e.path).str(e.link).put<uint8_t>(e.flags);
  if (e.flags & kEntryOwner)
    w->put<uint32_t>(e.uid).put<uint32_t>(e.gid).str(e.user).str(e.group);
  if (e.flags & kEntryXattrs) {
    w->put<uint32_t>(static_cast<uint32_t>(e.xattrs.size()));
    w->bytes(e.xattrs);
  }
  if (e.flags & (kEntryBasisFinal | kEntryBasisPart)) {
    const auto n = static_cast<uint32_t>(e.sent.size());
    std::vector<std::byte> bits((n + 7) / 8);
    for (uint32_t b = 0; b < n; ++b)
      if (e.sent[b]) bits[b / 8] |= std::byte{static_cast<uint8_t>(1u << (b % 8))};
    w->put<uint32_t>(n).bytes(bits);
  }
  if (e.flags & kEntryChecksum) w->put<uint64_t>(e.checksum);
}

Parsed parse_entry(Reader& rd, EntryRecord* e, std::string* why) {
  e->id = rd.get<uint32_t>();
  e->kind = rd.get<uint8_t>();
  e->mode = rd.get<uint32_t>();
  e->sec = rd.get<int64_t>();
  e->nsec = rd.get<uint32_t>();
  e->size = rd.get<uint64_t>();
  e->path = rd.str(kMaxPath);
  e->link = rd.str(kMaxPath);
  e->flags = rd.get<uint8_t>();
  if (!rd.ok() || (e->flags & ~kEntryKnown) != 0) return Parsed::kMalformed;
  if (e->flags & kEntryOwner) {
    e->uid = rd.get<uint32_t>();
    e->gid = rd.get<uint32_t>();
    e->user = rd.str(kMaxOwnerName);
    e->group = rd.str(kMaxOwnerName);
  }
  if (e->flags & kEntryXattrs) {
    const auto n = rd.get<uint32_t>();
    if (!rd.ok() || n > kMaxXattrBlob) return Parsed::kMalformed;
    const auto raw = rd.take(n);
    e->xattrs.assign(raw.begin(), raw.end());
  }
  if ((e->flags & kEntryBasisFinal) && (e->flags & kEntryBasisPart))
    return Parsed::kMalformed;
  if (e->flags & (kEntryBasisFinal | kEntryBasisPart)) {
    const auto n = rd.get<uint32_t>();
    if (!rd.ok() || e->size > kMaxFileSize || n != block_count(e->size))
      return Parsed::kMalformed;
    const auto bits = rd.take((n + 7) / 8);
    if (!rd.ok()) return Parsed::kMalformed;
    e->sent.resize(n);
    for (uint32_t b = 0; b < n; ++b)
      e->sent[b] = (std::to_integer<uint8_t>(bits[b / 8]) >> (b % 8)) & 1;
  }
  if (e->flags & kEntryChecksum) e->checksum = rd.get<uint64_t>();
  if (!rd.ok()) return Parsed::kMalformed;
  const auto kind = static_cast<Kind>(e->kind);
  if (kind != Kind::kFile && kind != Kind::kDir && kind != Kind::kSymlink &&
      kind != Kind::kHardlink)
    return Parsed::kMalformed;
  if (e->size > kMaxFileSize) {
    *why = "refused: declared size " + std::to_string(e->size) +
           " bytes exceeds the limit of " + std::to_string(kMaxFileSize);
    return Parsed::kRefused;
  }
  if (kind != Kind::kFile && kind != Kind::kHardlink && e->size != 0) {
    *why = "refused: a directory or symlink with a size";
    return Parsed::kRefused;
  }
  if (e->nsec > kMaxNsec) {
    *why = "refused: mtime nanoseconds out of range";
    return Parsed::kRefused;
  }
  if ((kind == Kind::kSymlink || kind == Kind::kHardlink) && e->link.empty()) {
    *why = "refused: link without a target";
    return Parsed::kRefused;
  }
  if (e->link.find('\0') != std::string::npos ||
      e->path.find('\0') != std::string::npos) {
    *why = "refused: NUL byte in a name";
    return Parsed::kRefused;
  }
  return Parsed::kOk;
}

Parsed parse_data(Reader& rd, DataRecord* d) {
  d->id = rd.get<uint32_t>();
  d->offset = rd.get<uint64_t>();
  d->len = rd.get<uint32_t>();
  d->digest = rd.get<uint64_t>();
  if (!rd.ok() || d->len > kSlotPayload) {
    rd.take(rd.left() + 1);  // the reader is bad from here
    return Parsed::kMalformed;
  }
  d->bytes = rd.take(d->len);
  return rd.ok() ? Parsed::kOk : Parsed::kMalformed;
}

bool data_in_file(const DataRecord& d, uint64_t size) {
  if (d.len == 0 || size > kMaxFileSize || !range_within(d.offset, d.len, size))
    return false;
  return d.offset / kBlockSize == (d.offset + d.len - 1) / kBlockSize;
}

Parsed parse_request(std::span<const std::byte> msg, Request* r) {
  Reader rd(msg);
  r->type = rd.get<uint8_t>();
  r->version = rd.get<uint32_t>();
  if (!rd.ok() || static_cast<Msg>(r->type) != Msg::kHello) return Parsed::kMalformed;
  if (r->version != kProtocolVersion) return Parsed::kRefused;
  r->op = rd.get<uint8_t>();
  r->flags = rd.get<uint8_t>();
  const auto n = rd.get<uint32_t>();
  if (!rd.ok() || n == 0 || n > kMaxRequestPaths) return Parsed::kMalformed;
  const auto op = static_cast<Op>(r->op);
  if (op != Op::kPush && op != Op::kPull) return Parsed::kMalformed;
  r->paths.clear();
  for (uint32_t i = 0; i < n; ++i) {
    r->paths.push_back(rd.str(kMaxPath));
    if (!rd.ok()) return Parsed::kMalformed;
  }
  // A push names its destination and the number of its sources.
  if (op == Op::kPush && r->paths.size() != 2) return Parsed::kMalformed;
  r->sync = rd.get<uint32_t>();
  const auto nfilters = rd.get<uint32_t>();
  if (!rd.ok() || (r->sync & ~kSyncKnown) != 0 || nfilters > kMaxFilterBlob)
    return Parsed::kMalformed;
  const auto filters = rd.take(nfilters);
  r->filters.assign(filters.begin(), filters.end());
  r->partial_dir = rd.str(255);
  r->bwlimit = rd.get<uint64_t>();
  r->lanes = rd.get<uint8_t>();
  if (!rd.ok() || !valid_partial_dir(r->partial_dir) || r->lanes == 0 ||
      r->lanes > kMaxLanes)
    return Parsed::kMalformed;
  return rd.at_end() ? Parsed::kOk : Parsed::kMalformed;
}

void encode_request(const Request& r, Writer* w) {
  w->put<uint32_t>(r.version).put<uint8_t>(r.op).put<uint8_t>(r.flags);
  w->put<uint32_t>(static_cast<uint32_t>(r.paths.size()));
  for (const std::string& p : r.paths) w->str(p);
  w->put<uint32_t>(r.sync).put<uint32_t>(static_cast<uint32_t>(r.filters.size()));
  w->bytes(r.filters);
  w->str(r.partial_dir);
  w->put<uint64_t>(r.bwlimit).put<uint8_t>(r.lanes);
}

bool valid_partial_dir(const std::string& name) {
  return name.empty() ||
         (name.size() <= 255 && name != "." && name != ".." &&
          name.find('/') == std::string::npos && name.find('\0') == std::string::npos);
}

}  // namespace rdmakit::cp
