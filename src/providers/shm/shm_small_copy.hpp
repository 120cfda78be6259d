#pragma once
// memcpy of a few bytes without a library call: the lengths here (SEND
// payloads riding in a receive slot, 8-byte WRITEs and READs) are known only
// at run time, so std::memcpy would call into libc on every message.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace rdmakit::shm {

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

// memcpy whose stores bypass the writer's caches (non-temporal), for data
// another core reads next: a line left dirty in the writer's cache must be
// fetched from there by the reader and taken back by the writer's next pass,
// which between two cores costs more than memory when the cores are far
// apart. Ends with a store fence, so a release store that publishes the data
// afterwards orders after it.
inline void copy_streaming(void* dst, const void* src, size_t n) noexcept {
#if defined(__x86_64__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (n < head + 64) {
    std::memcpy(d, s, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const auto* from = reinterpret_cast<const __m128i*>(s);
    auto* to = reinterpret_cast<__m128i*>(d);
    const __m128i a = _mm_loadu_si128(from);
    const __m128i b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2);
    const __m128i e = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, e);
  }
  std::memcpy(d, s, n);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace rdmakit::shm
