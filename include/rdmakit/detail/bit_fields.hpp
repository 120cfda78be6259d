#pragma once
// A 64-bit word made of bit fields, the one codec of the library's work
// request ids (streams: [slot:24][generation:8][kind:4][count:7][bytes:21],
// sessions: [slot:16][generation:16][channel:8][kind:8][index:16]). The
// widths are listed most significant first and must fill the word. encode()
// keeps the low bits of each value (the field's width); a value that does
// not fit is a compile error where the encoding is a constant expression, so
// the layouts' own static_asserts check their ranges. All of it is constexpr
// and inline: shifts and masks, as written by hand.
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace rdmakit::detail {

// Not constexpr: a constant evaluation that reaches it fails to compile.
inline void bit_field_out_of_range() noexcept {}

template <unsigned... Widths>
class BitFields {
 public:
  static constexpr size_t kFields = sizeof...(Widths);
  static_assert(kFields > 0, "at least one field");
  static_assert(((Widths > 0 && Widths <= 64) && ...), "field widths are 1 to 64 bits");
  static_assert((Widths + ...) == 64, "the field widths fill the 64-bit word");

  template <size_t I>
  static constexpr unsigned width() noexcept {
    static_assert(I < kFields, "no such field");
    return kWidths[I];
  }
  // The largest value field I holds.
  template <size_t I>
  static constexpr uint64_t max() noexcept {
    return mask(width<I>());
  }
  // The word holding values..., one per field, most significant first.
  template <typename... Values>
  static constexpr uint64_t encode(Values... values) noexcept {
    static_assert(sizeof...(Values) == kFields, "one value per field");
    return encode_from<0>(values...);
  }
  // Field I of word, as T (an integer or an enumeration).
  template <size_t I, typename T = uint64_t>
  static constexpr T decode(uint64_t word) noexcept {
    return static_cast<T>((word >> shift<I>()) & max<I>());
  }

 private:
  static constexpr std::array<unsigned, kFields> kWidths{Widths...};

  static constexpr uint64_t mask(unsigned bits) noexcept {
    return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  }
  // Bits below field I: the widths of the fields after it.
  template <size_t I>
  static constexpr unsigned shift() noexcept {
    static_assert(I < kFields, "no such field");
    unsigned bits = 0;
    for (size_t j = I + 1; j < kFields; ++j) bits += kWidths[j];
    return bits;
  }
  template <typename T>
  static constexpr uint64_t as_bits(T value) noexcept {
    if constexpr (std::is_enum_v<T>) {
      return static_cast<uint64_t>(static_cast<std::underlying_type_t<T>>(value));
    } else {
      static_assert(std::is_integral_v<T>, "fields hold integers or enumerations");
      return static_cast<uint64_t>(value);
    }
  }
  template <size_t I, typename T>
  static constexpr uint64_t field(T value) noexcept {
    const uint64_t bits = as_bits(value);
    if (std::is_constant_evaluated() && bits > max<I>()) bit_field_out_of_range();
    return (bits & max<I>()) << shift<I>();
  }
  template <size_t I, typename T, typename... Rest>
  static constexpr uint64_t encode_from(T value, Rest... rest) noexcept {
    if constexpr (sizeof...(Rest) == 0) {
      return field<I>(value);
    } else {
      return field<I>(value) | encode_from<I + 1>(rest...);
    }
  }
};

}  // namespace rdmakit::detail
