#pragma once
// The shm provider's copies: the toolkit's copies of a few bytes
// (rdmakit/detail/small_copy.hpp: SEND payloads riding in a receive slot,
// 8-byte WRITEs and READs) and copy_streaming, the non-temporal copy of
// WRITEs another core reads next.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "rdmakit/detail/small_copy.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace rdmakit::shm {

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
