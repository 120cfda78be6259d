// rdmakit-cp's record parser (apps/cp/records.hpp) fed what a hostile peer
// could send: the first byte picks the input's kind, the rest is
//   0: a slot payload (records_hash, then entry/data/end/abort records as
//      the receiver walks them, each data record checked against the size
//      the last entry declared),
//   1: an entry list (a kCheck body: what the receiver's generator parses),
//   2: a client's hello,
//   3: include/exclude rules (FilterRules::decode, from the hello),
//   4: extended attributes and an owner (metadata.hpp, from entries).
// Whatever parses must satisfy the bounds the receiver relies on before it
// indexes or allocates (limits.hpp); a violation traps.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "filter.hpp"
#include "limits.hpp"
#include "metadata.hpp"
#include "protocol.hpp"
#include "records.hpp"
#include "tree.hpp"

using namespace rdmakit::cp;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void slot_payload(std::span<const std::byte> in) {
  bool parsed = false;
  (void)records_hash(in, &parsed);
  Reader rd(in);
  uint64_t size = 0;
  bool have_file = false;
  for (int i = 0; i < 100000 && rd.ok() && !rd.at_end(); ++i) {
    const auto type = static_cast<Rec>(rd.get<uint8_t>());
    switch (type) {
      case Rec::kEntry: {
        EntryRecord e;
        std::string why;
        const Parsed p = parse_entry(rd, &e, &why);
        if (p == Parsed::kMalformed) return;
        have_file = p == Parsed::kOk && static_cast<Kind>(e.kind) == Kind::kFile;
        if (p == Parsed::kRefused) require(!why.empty());
        if (have_file) {
          size = e.size;
          require(size <= kMaxFileSize && block_count(size) <= kMaxBlocks);
          require(e.path.size() <= kMaxPath && e.link.size() <= kMaxPath);
          require(e.nsec <= kMaxNsec);
          require(applied_mode(e.mode, false) <= 0777);
        }
        break;
      }
      case Rec::kData: {
        DataRecord d;
        if (parse_data(rd, &d) != Parsed::kOk) {
          require(!rd.ok());
          return;
        }
        require(d.bytes.size() == d.len && d.len <= kSlotPayload);
        if (have_file && data_in_file(d, size)) {
          // What the receiver then indexes and writes.
          require(d.len > 0 && d.offset < size && d.offset + d.len <= size);
          require(d.offset / kBlockSize < block_count(size));
          require((d.offset + d.len - 1) / kBlockSize == d.offset / kBlockSize);
        }
        break;
      }
      case Rec::kEnd: rd.take(4 + 8); break;
      case Rec::kAbort:
        rd.take(4);
        rd.str(kMaxPath);
        break;
      default: return;
    }
  }
}

void entry_list(std::span<const std::byte> in) {
  Reader rd(in);
  const auto n = rd.get<uint32_t>();
  for (uint32_t i = 0; i < n && i < 100000 && rd.ok(); ++i) {
    EntryRecord e;
    std::string why;
    const Parsed p = parse_entry(rd, &e, &why);
    if (p == Parsed::kMalformed) return;
    if (p == Parsed::kRefused) require(!why.empty());
    require(e.path.size() <= kMaxPath && e.link.size() <= kMaxPath);
    require(e.xattrs.size() <= kMaxXattrBlob);
    require(e.user.size() <= kMaxOwnerName && e.group.size() <= kMaxOwnerName);
    // A basis bitmap is one bit per block of the declared size.
    if (e.flags & (kEntryBasisFinal | kEntryBasisPart))
      require(e.size <= kMaxFileSize && e.sent.size() == block_count(e.size));
  }
}

void filter_rules(std::span<const std::byte> in) {
  FilterRules rules;
  std::string why;
  if (!FilterRules::decode(in, &rules, &why)) return;
  require(rules.size() <= kMaxFilterRules);
  (void)rules.excluded("a/b/c.txt", false);
  (void)rules.excluded("a/b", true);
}

void attributes(std::span<const std::byte> in) {
  std::vector<Xattr> list;
  size_t used = 0;
  std::string why;
  if (decode_xattrs(in, &used, &list, &why)) {
    require(used <= in.size() && list.size() <= kMaxXattrs);
    size_t total = 0;
    for (const Xattr& x : list) {
      require(x.name.size() <= kMaxXattrName && x.value.size() <= kMaxXattrValue);
      total += x.name.size() + x.value.size();
    }
    require(total <= kMaxXattrTotal);
  }
  Owner o;
  if (decode_owner(in, &used, &o, &why)) require(used <= in.size());
}

void request(std::span<const std::byte> in) {
  Request r;
  if (parse_request(in, &r) != Parsed::kOk) return;
  require(r.version == kProtocolVersion);
  require(!r.paths.empty() && r.paths.size() <= kMaxRequestPaths);
  require(static_cast<Op>(r.op) != Op::kPush || r.paths.size() == 2);
  for (const std::string& s : r.paths) require(s.size() <= kMaxPath);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> body(reinterpret_cast<const std::byte*>(data) + 1,
                                        size - 1);
  switch (data[0] % 5) {
    case 0: slot_payload(body); break;
    case 1: entry_list(body); break;
    case 2: request(body); break;
    case 3: filter_rules(body); break;
    default: attributes(body); break;
  }
  return 0;
}
