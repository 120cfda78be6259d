#pragma once
// The records inside a slot (protocol version 4) and the hash that guards
// them. A slot's payload is a sequence of records:
//   entry: u8 type, then the entry's metadata (encode_entry below)
//   data:  u8 type, u32 id, u64 offset, u32 len, u64 block digest, len bytes
//   end:   u8 type, u32 id, u64 file hash
//   abort: u8 type, u32 id, str reason
// (str = u32 length + bytes). The slot header's hash covers every payload
// byte except the data bytes; each data record carries instead the running
// xxh3 of its block up to the end of the record (see BlockHasher), which the
// receiver checks as it writes the bytes. Every byte is hashed once per end,
// and the block hashes (and from them the file hash) fall out of the same pass.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace rdmakit::cp {

// A data record's header: type, id, offset, len, digest.
inline constexpr size_t kDataHeader = 1 + 4 + 8 + 4 + 8;

// xxh3 of a slot's payload without the bytes of its data records. Sets *ok to
// false (and returns 0) if the records do not parse: a length or type
// damaged in flight.
uint64_t records_hash(std::span<const std::byte> payload, bool* ok);

class Reader;
class Writer;

// How a record (or request) read from the wire turned out: well-formed and
// within bounds; well-formed but a value out of bounds (that file is
// refused, the transfer goes on); or not parseable (the transfer ends).
enum class Parsed : uint8_t { kOk, kRefused, kMalformed };

// What an entry's metadata carries beyond the fixed fields.
enum EntryFlags : uint8_t {
  kEntryOwner = 1,       // uid, gid and their names (-o, -g)
  kEntryXattrs = 2,      // encoded extended attributes (-X, -A)
  kEntryBasisFinal = 4,  // delta: unsent blocks come from the file under its name
  kEntryBasisPart = 8,   // delta: unsent blocks are in the part file (--resume)
  kEntryChecksum = 16,   // the file hash (check lists under --checksum)
  kEntryKnown = 31,
};
inline constexpr uint32_t kMaxOwnerName = 255;
// An entry with its attributes fits one list message (kMaxMessage) with
// its two paths.
inline constexpr uint32_t kMaxXattrBlob = 32 * 1024;

// An entry's metadata, as listed (kCheck) and as sent before its data:
//   u32 id, u8 kind, u32 mode, i64 mtime_sec, u32 mtime_nsec, u64 size,
//   str path, str link, u8 flags,
//   [owner: u32 uid, u32 gid, str user, str group]
//   [xattrs: u32 len, len bytes]
//   [basis: u32 nblocks, ceil(nblocks / 8) bytes: blocks that follow as data]
//   [checksum: u64 file hash]
struct EntryRecord {
  uint32_t id = 0;
  uint8_t kind = 0;  // Kind
  uint32_t mode = 0;
  int64_t sec = 0;
  uint32_t nsec = 0;
  uint64_t size = 0;
  std::string path, link;
  uint8_t flags = 0;  // EntryFlags
  uint32_t uid = 0, gid = 0;
  std::string user, group;
  std::vector<std::byte> xattrs;
  std::vector<bool> sent;  // per block, with a basis
  uint64_t checksum = 0;
};
void encode_entry(const EntryRecord& e, Writer* w);
// After the record type. kRefused with *why for a size over kMaxFileSize,
// an unknown kind, a symlink without target, nanoseconds out of range.
Parsed parse_entry(Reader& rd, EntryRecord* e, std::string* why);

struct DataRecord {
  uint32_t id = 0;
  uint64_t offset = 0;
  uint32_t len = 0;
  uint64_t digest = 0;
  std::span<const std::byte> bytes;
};
// After the record type; structure only (the range is checked against the
// file's declared size by data_in_file).
Parsed parse_data(Reader& rd, DataRecord* d);
// A data record fits a file of `size`: not empty, within it, one block.
bool data_in_file(const DataRecord& d, uint64_t size);

struct Request {
  uint8_t type = 0;  // Msg
  uint32_t version = 0;
  uint8_t op = 0;  // Op
  uint8_t flags = 0;
  std::vector<std::string> paths;
  uint32_t sync = 0;               // SyncFlags
  std::vector<std::byte> filters;  // encoded include/exclude rules
  std::string partial_dir;         // --partial-dir (one name) or ""
  uint64_t bwlimit = 0;  // --bwlimit: data bytes per second the sender posts, 0 any
  uint8_t lanes = 1;     // lanes asked for (1..kMaxLanes); the reply grants some
};
inline constexpr uint32_t kMaxFilterBlob = 1u << 20;
// A client's hello: the fields above after the message type.
void encode_request(const Request& r, Writer* w);
// --partial-dir names one directory beside each file: not "", ".", ".."
// or anything with a '/' (so it cannot lead elsewhere).
bool valid_partial_dir(const std::string& name);
// A client's hello, from its first byte. kRefused: another protocol
// version (the rest is not read); kMalformed: anything else wrong.
Parsed parse_request(std::span<const std::byte> msg, Request* r);

}  // namespace rdmakit::cp
