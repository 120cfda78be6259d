#pragma once
// The framing the connection hellos share (shm, tcp, session, stream): a
// 32-bit magic at offset 0, the protocol version right after it (8, 16 or 32
// bits), both in the protocol's byte order (little-endian on the wire; the
// shm hello, a struct between processes of one host, is in the host's), and
// a size the receiver checks (exactly, or at least). What follows the
// version differs per protocol and stays its own; this only writes and
// checks the frame, so no wire byte changes with it.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace rdmakit::detail {

enum class HelloSize : uint8_t {
  kExactly,  // a hello is this many bytes, no more and no less
  kAtLeast,  // the rest is the protocol's to bound
};

// Why a hello was not taken, in the order checked.
enum class HelloFault : uint8_t { kNone, kMagic, kVersion, kSize };

template <typename Version, std::endian Order = std::endian::little>
struct HelloFrame {
  static_assert(std::is_unsigned_v<Version> && sizeof(Version) <= 4,
                "an 8, 16 or 32-bit version");
  static_assert(Order == std::endian::little || Order == std::endian::big);
  // Magic and version: the bytes every hello of the protocol starts with.
  static constexpr size_t kPrefix = 4 + sizeof(Version);

  uint32_t magic;
  Version version;
  size_t size;  // the hello's bytes, kPrefix included
  HelloSize rule;

  struct Check {
    HelloFault fault = HelloFault::kNone;
    Version version = 0;  // what the peer sent (0 when it sent none)
    explicit operator bool() const noexcept { return fault == HelloFault::kNone; }
    const char* why() const noexcept {
      switch (fault) {
        case HelloFault::kNone: return "";
        case HelloFault::kMagic: return "bad magic";
        case HelloFault::kVersion: return "unsupported protocol version";
        case HelloFault::kSize: return "wrong size";
      }
      return "";
    }
  };

  // Writes magic and version at out[0, kPrefix).
  void put(std::byte* out) const noexcept {
    store(out, magic);
    store(out + 4, version);
  }
  // The magic, then the version, then the size of a received hello.
  Check check(std::span<const std::byte> in) const noexcept {
    if (in.size() < 4 || load<uint32_t>(in.data()) != magic) return {HelloFault::kMagic};
    if (in.size() < kPrefix) return {HelloFault::kVersion};
    const auto seen = load<Version>(in.data() + 4);
    if (seen != version) return {HelloFault::kVersion, seen};
    const bool sized =
        rule == HelloSize::kExactly ? in.size() == size : in.size() >= size;
    if (!sized) return {HelloFault::kSize, seen};
    return {HelloFault::kNone, seen};
  }

 private:
  // Byte i of a T in Order holds bits [8 * shift(i), 8 * shift(i) + 8).
  template <typename T>
  static constexpr size_t shift(size_t i) noexcept {
    return Order == std::endian::little ? i : sizeof(T) - 1 - i;
  }
  template <typename T>
  static void store(std::byte* out, T value) noexcept {
    for (size_t i = 0; i < sizeof(T); ++i) {
      out[i] = static_cast<std::byte>(value >> (8 * shift<T>(i)));
    }
  }
  template <typename T>
  static T load(const std::byte* in) noexcept {
    T value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      value = static_cast<T>(value | (static_cast<T>(in[i]) << (8 * shift<T>(i))));
    }
    return value;
  }
};

}  // namespace rdmakit::detail
