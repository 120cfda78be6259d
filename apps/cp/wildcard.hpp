#pragma once
// The wildcards of rsync's include/exclude patterns, as rsync(1) documents
// them ("PATTERN MATCHING RULES"): '?' is any byte but '/', '*' any run of
// bytes without a '/', two or more '*' any run at all, "[...]" one byte
// other than '/' from a class ('!' or '^' first negates; ranges; [:name:]
// for the ASCII classes of the C locale; a ']' first or a '-' at either end
// is literal), and '\' takes the next byte literally.
//
// A pattern is compiled once into a row of one-byte tests ("steps"); a star
// becomes a loop on the position between two steps, taking any byte ("**")
// or any but '/' ('*'). Matching follows every position at once, one bit
// each, a byte of text at a time, the way shift-and string search does:
//   live = (live & loops(byte)) | ((live << 1) & moves(byte))
// where moves(byte) has bit i + 1 if step i takes that byte. No
// backtracking, so whatever the pattern, time is text length x (steps / 64)
// word operations plus building moves(): once per byte value for a pattern
// under 64 steps, else per call, for the bytes the text has.
// fnmatch(3) is not used: FNM_PATHNAME has no "**".
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace rdmakit::cp {

class Wildcard {
 public:
  // Where a match may begin: at the start of the text, or also right after
  // any '/' in it (a match of some trailing run of whole components).
  enum class Start : uint8_t { kText, kAnyComponent };

  // Matches only the empty text.
  Wildcard() = default;
  // A pattern with wildcards. A malformed one (an unclosed class, an
  // unknown [:name:], a trailing '\') compiles to one matching nothing.
  static Wildcard compile(std::string_view pattern);
  // Every byte for itself ('\', '*', '?' and '[' included).
  static Wildcard literal(std::string_view text);

  // Whether the concatenation of `text` matches, from a start `start`
  // allows to its end.
  bool matches(std::initializer_list<std::string_view> text,
               Start start = Start::kText) const;

 private:
  using ByteSet = std::array<uint64_t, 4>;
  // A step below 256 is that byte; kAnyButSlash is '?'; from kFirstSet on,
  // sets_[step - kFirstSet].
  static constexpr uint16_t kAnyButSlash = 256;
  static constexpr uint16_t kFirstSet = 257;

  static Wildcard never();
  bool takes(uint16_t step, uint8_t c) const;
  // Where byte c moves the positions: bit i + 1 of row if step i takes c.
  void fill_moves(uint8_t c, uint64_t* row) const;
  // Makes the loop masks (loops[i]: the loop at position i, 0 none, 1 '*',
  // 2 "**") and, for a short pattern, short_moves_.
  void set_loops(const std::vector<uint8_t>& loops);

  std::vector<uint16_t> steps_;
  std::vector<ByteSet> sets_;
  // Bit i: position i loops on a byte other than '/' ('*' or "**"), on '/'
  // ("**" only). Both have steps_.size() / 64 + 1 words.
  std::vector<uint64_t> loop_on_byte_ = {0};
  std::vector<uint64_t> loop_on_slash_ = {0};
  // Under 64 steps: fill_moves() of every byte (else built as needed).
  std::vector<uint64_t> short_moves_;
  bool never_ = false;    // malformed: matches nothing
  bool literal_ = false;  // from literal(): a plain comparison will do
};

}  // namespace rdmakit::cp
