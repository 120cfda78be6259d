#pragma once
// Fixed little-endian encoding for wire formats (RemoteRegion blob, tcp
// frames). GCC 12 lacks std::byteswap, hence the builtins.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmakit::core {

template <typename T>
T to_little(T value) noexcept {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) return __builtin_bswap64(value);
    if constexpr (sizeof(T) == 4) return __builtin_bswap32(value);
    if constexpr (sizeof(T) == 2) return __builtin_bswap16(value);
  }
  return value;
}

template <typename T>
void put_le(std::byte* at, T value) noexcept {
  value = to_little(value);
  std::memcpy(at, &value, sizeof value);
}

template <typename T>
T get_le(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof value);
  return to_little(value);
}

}  // namespace rdmakit::core
