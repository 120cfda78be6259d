#pragma once
// memcpy of a few bytes without a library call: the lengths copied on the
// data paths (SEND payloads riding in an shm receive slot, 8-byte WRITEs and
// READs, stream records and small reads) are known only at run time, so
// std::memcpy would call into libc on every message.
#include <cstddef>
#include <cstring>

namespace rdmakit::detail {

inline constexpr size_t kSmallCopyMax = 64;

// Copies n <= Max bytes between non-overlapping buffers: whole words, then
// the last word again (overlapping) for a ragged end. Max bounds the word
// loop at compile time, so the optimizer can prove a copy into a Max-byte
// array stays inside it.
// GCC's -Wstringop-overflow reports the word loop as overflowing a Max-byte
// destination once inlined after a run-time bound check it does not track;
// every caller checks n <= Max (asserted by the unreachable below).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
template <size_t Max = kSmallCopyMax>
[[gnu::always_inline]] inline void small_copy(void* dst, const void* src,
                                              size_t n) noexcept {
  static_assert(Max >= 8 && Max <= kSmallCopyMax);
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const auto copy = [&](size_t at, size_t width) { std::memcpy(d + at, s + at, width); };
  if (n > Max) __builtin_unreachable();
  if (n >= 8) {
    for (size_t at = 0; at + 8 <= n && at + 8 <= Max; at += 8) copy(at, 8);
    copy(n - 8, 8);
  } else if (n >= 4) {
    copy(0, 4);
    copy(n - 4, 4);
  } else if (n != 0) {
    copy(0, 1);
    copy(n / 2, 1);
    copy(n - 1, 1);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// std::memcpy for large copies, small_copy for the rest.
inline void copy_bytes(void* dst, const void* src, size_t n) noexcept {
  if (n <= kSmallCopyMax) {
    small_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace rdmakit::detail
