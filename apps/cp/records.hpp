#pragma once
// The records inside a slot (protocol version 2) and the hash that guards
// them. A slot's payload is a sequence of records:
//   entry: u8 type, u32 id, u8 kind, u32 mode, i64 mtime_sec, u32 mtime_nsec,
//          u64 size, str path, str link target
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

// How a record (or request) read from the wire turned out: well-formed and
// within bounds; well-formed but a value out of bounds (that file is
// refused, the transfer goes on); or not parseable (the transfer ends).
enum class Parsed : uint8_t { kOk, kRefused, kMalformed };

struct EntryRecord {
  uint32_t id = 0;
  uint8_t kind = 0;  // Kind
  uint32_t mode = 0;
  int64_t sec = 0;
  uint32_t nsec = 0;
  uint64_t size = 0;
  std::string path, link;
};
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

struct ProbeRecord {
  uint32_t id = 0;
  std::string path;
  uint64_t size = 0;
  std::vector<uint64_t> hashes;  // one per block
};
// After the message type. kMalformed also for a size over kMaxFileSize or a
// block count that does not match the size.
Parsed parse_probe(Reader& rd, ProbeRecord* p);

struct Request {
  uint8_t type = 0;  // Msg
  uint32_t version = 0;
  uint8_t op = 0;  // Op
  uint8_t flags = 0;
  std::vector<std::string> paths;
};
// A client's hello, from its first byte. kRefused: another protocol
// version (the rest is not read); kMalformed: anything else wrong.
Parsed parse_request(std::span<const std::byte> msg, Request* r);

}  // namespace rdmakit::cp
