#pragma once
// memcpy of a few bytes without a library call: the lengths here (SEND
// payloads riding in a receive slot, 8-byte WRITEs and READs) are known only
// at run time, so std::memcpy would call into libc on every message.
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmakit::shm {

inline constexpr size_t kSmallCopyMax = 64;

// Copies n <= kSmallCopyMax bytes between non-overlapping buffers with at
// most eight loads and eight stores (overlapping words for odd lengths).
inline void small_copy(void* dst, const void* src, size_t n) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (n >= 32) {
    uint64_t w[8];
    for (size_t i = 0; i < 4; ++i) std::memcpy(&w[i], s + 8 * i, 8);
    for (size_t i = 0; i < 4; ++i) std::memcpy(&w[4 + i], s + n - 32 + 8 * i, 8);
    for (size_t i = 0; i < 4; ++i) std::memcpy(d + 8 * i, &w[i], 8);
    for (size_t i = 0; i < 4; ++i) std::memcpy(d + n - 32 + 8 * i, &w[4 + i], 8);
  } else if (n >= 16) {
    uint64_t w[4];
    std::memcpy(&w[0], s, 8);
    std::memcpy(&w[1], s + 8, 8);
    std::memcpy(&w[2], s + n - 16, 8);
    std::memcpy(&w[3], s + n - 8, 8);
    std::memcpy(d, &w[0], 8);
    std::memcpy(d + 8, &w[1], 8);
    std::memcpy(d + n - 16, &w[2], 8);
    std::memcpy(d + n - 8, &w[3], 8);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, s, 8);
    std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8);
    std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, s, 4);
    std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4);
    std::memcpy(d + n - 4, &b, 4);
  } else if (n != 0) {
    d[0] = s[0];
    d[n / 2] = s[n / 2];
    d[n - 1] = s[n - 1];
  }
}

// std::memcpy for large copies, small_copy for the rest.
inline void copy_bytes(void* dst, const void* src, size_t n) noexcept {
  if (n <= kSmallCopyMax) {
    small_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace rdmakit::shm
