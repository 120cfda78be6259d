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

namespace rdmakit::cp {

// A data record's header: type, id, offset, len, digest.
inline constexpr size_t kDataHeader = 1 + 4 + 8 + 4 + 8;

// xxh3 of a slot's payload without the bytes of its data records. Sets *ok to
// false (and returns 0) if the records do not parse: a length or type
// damaged in flight.
uint64_t records_hash(std::span<const std::byte> payload, bool* ok);

}  // namespace rdmakit::cp
