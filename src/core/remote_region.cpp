// RemoteRegion wire format (32 bytes, little-endian):
//   0  'R' 'K'  magic
//   2  u8       version (1)
//   3  u8       provider
//   4  u32      rkey
//   8  u64      addr
//   16 u64      length
//   24 u32      access
//   28 u32      reserved (0)
#include <bit>
#include <cstring>

#include "core/little_endian.hpp"
#include "rdmakit/memory.hpp"

namespace rdmakit {
using core::get_le;
using core::put_le;

void RemoteRegion::serialize(std::span<std::byte, kSerializedSize> out) const noexcept {
  std::byte* p = out.data();
  p[0] = std::byte{'R'};
  p[1] = std::byte{'K'};
  p[2] = std::byte{kVersion};
  p[3] = static_cast<std::byte>(provider);
  put_le<uint32_t>(p + 4, rkey);
  put_le<uint64_t>(p + 8, addr);
  put_le<uint64_t>(p + 16, length);
  put_le<uint32_t>(p + 24, access);
  put_le<uint32_t>(p + 28, 0);
}

std::vector<std::byte> RemoteRegion::serialize() const {
  std::vector<std::byte> blob(kSerializedSize);
  serialize(std::span<std::byte, kSerializedSize>(blob.data(), kSerializedSize));
  return blob;
}

std::optional<RemoteRegion> RemoteRegion::deserialize(
    std::span<const std::byte> in) noexcept {
  if (in.size() < kSerializedSize) return std::nullopt;
  const std::byte* p = in.data();
  if (p[0] != std::byte{'R'} || p[1] != std::byte{'K'}) return std::nullopt;
  if (p[2] != std::byte{kVersion}) return std::nullopt;
  const auto provider = static_cast<uint8_t>(p[3]);
  if (provider > static_cast<uint8_t>(ProviderKind::kVerbs)) return std::nullopt;
  RemoteRegion region;
  region.provider = static_cast<ProviderKind>(provider);
  region.rkey = get_le<uint32_t>(p + 4);
  region.addr = get_le<uint64_t>(p + 8);
  region.length = get_le<uint64_t>(p + 16);
  region.access = get_le<uint32_t>(p + 24);
  if (region.access & ~static_cast<uint32_t>(kAccessAll)) return std::nullopt;
  return region;
}

}  // namespace rdmakit
