#pragma once
// iovec arrays on the data path: their total length, a cursor that walks
// them from a byte offset, and copies between them and a ring (split at the
// ring's end).
#include <limits.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "rdmakit/detail/small_copy.hpp"
#include "stream/wire.hpp"

namespace rdmakit::stream::detail {

// Total length of an iovec array, or -EINVAL.
inline ssize_t iov_total(const iovec* iov, int iovcnt) noexcept {
  if (iovcnt < 0 || iovcnt > IOV_MAX || (iovcnt > 0 && iov == nullptr)) return -EINVAL;
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len > static_cast<size_t>(SSIZE_MAX) - total) return -EINVAL;
    total += iov[i].iov_len;
  }
  return static_cast<ssize_t>(total);
}

// Walks an iovec array from a byte offset.
struct IovCursor {
  const iovec* iov;
  int cnt;
  int i = 0;
  size_t off = 0;
  IovCursor(const iovec* v, int n, size_t skip) noexcept : iov(v), cnt(n) {
    while (i < cnt && skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      ++i;
    }
    off = skip;
  }
  // Contiguous piece at the cursor (at most max bytes).
  std::pair<std::byte*, size_t> piece(size_t max) noexcept {
    while (i < cnt && off == iov[i].iov_len) {
      ++i;
      off = 0;
    }
    if (i == cnt) return {nullptr, 0};
    return {static_cast<std::byte*>(iov[i].iov_base) + off,
            std::min(max, iov[i].iov_len - off)};
  }
  void advance(size_t n) noexcept { off += n; }
};

// n bytes of a ring from count `pos` (its offset: pos % size) to the cursor.
inline void ring_to_iov(const std::byte* ring, uint64_t size, uint64_t pos,
                        IovCursor& cur, size_t n) noexcept {
  while (n > 0) {
    const uint64_t at = pos % size;
    auto [dst, len] = cur.piece(std::min<uint64_t>(n, size - at));
    rdmakit::detail::copy_bytes(dst, ring + at, len);
    cur.advance(len);
    pos += len;
    n -= len;
  }
}

// n bytes from the cursor into a ring at count `pos`.
inline void iov_to_ring(std::byte* ring, uint64_t size, uint64_t pos, IovCursor& cur,
                        size_t n) noexcept {
  while (n > 0) {
    const uint64_t at = pos % size;
    auto [src, len] = cur.piece(std::min<uint64_t>(n, size - at));
    rdmakit::detail::copy_bytes(ring + at, src, len);
    cur.advance(len);
    pos += len;
    n -= len;
  }
}

}  // namespace rdmakit::stream::detail
