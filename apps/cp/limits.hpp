#pragma once
// Bounds on what a peer may declare. Every count, size, offset and length
// read from the wire is checked against these before it is used in
// arithmetic, to size an allocation or to index anything; a value out of
// range fails that file (or that transfer) with a reason, never the process.
#include <cstdint>
#include <string>

#include "protocol.hpp"

namespace rdmakit::cp {

// Largest file a peer may declare: 1 TiB = 2^20 blocks (8 MiB of block
// hashes on the receiving side). block_count() stays far from 2^32.
inline constexpr uint64_t kMaxFileSize = uint64_t{1} << 40;
inline constexpr uint32_t kMaxBlocks =
    static_cast<uint32_t>((kMaxFileSize + kBlockSize - 1) / kBlockSize);
// Longest path or symlink target on the wire (PATH_MAX).
inline constexpr uint32_t kMaxPath = 4096;
// Most paths a request may name.
inline constexpr uint32_t kMaxRequestPaths = 4096;
// Nanoseconds of an mtime.
inline constexpr uint32_t kMaxNsec = 999999999;
// Mode bits a peer may set without --preserve-special.
inline constexpr uint32_t kPlainModeBits = 0777;
inline constexpr uint32_t kSpecialModeBits = 07000;

// True if [off, off + len) lies within a file of `size` (no overflow).
inline bool range_within(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}

// The mode to apply to what a peer sent.
inline uint32_t applied_mode(uint32_t wire_mode, bool preserve_special) {
  return wire_mode &
         (preserve_special ? (kPlainModeBits | kSpecialModeBits) : kPlainModeBits);
}

// "16G", "512M", "1000" -> bytes (K/M/G/T are powers of 1024). False when
// malformed or when it overflows.
bool parse_size(const std::string& text, uint64_t* out);

// Free space check: `need` bytes fit into the filesystem of `fd` keeping a
// margin (1 % of its size, at most 256 MiB). On refusal *why says how much
// is free. True also when the filesystem cannot be asked.
bool fits_free_space(int fd, uint64_t need, std::string* why);

}  // namespace rdmakit::cp
