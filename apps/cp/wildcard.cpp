#include "wildcard.hpp"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string_view>

namespace rdmakit::cp {
namespace {

using ByteSet = std::array<uint64_t, 4>;
constexpr size_t kNone = std::string_view::npos;

void put(ByteSet& s, unsigned c) { s[c >> 6] |= uint64_t{1} << (c & 63); }

// Whether the ASCII byte c is in [:name:]; nullopt for an unknown name.
std::optional<bool> in_named(std::string_view name, int c) {
  const bool upper = c >= 'A' && c <= 'Z';
  const bool lower = c >= 'a' && c <= 'z';
  const bool digit = c >= '0' && c <= '9';
  const bool graph = c > ' ' && c < 0x7f;
  if (name == "alpha") return upper || lower;
  if (name == "upper") return upper;
  if (name == "lower") return lower;
  if (name == "digit") return digit;
  if (name == "alnum") return upper || lower || digit;
  if (name == "xdigit") return digit || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
  if (name == "space") return c == ' ' || (c >= '\t' && c <= '\r');
  if (name == "blank") return c == ' ' || c == '\t';
  if (name == "cntrl") return c < ' ' || c == 0x7f;
  if (name == "graph") return graph;
  if (name == "print") return graph || c == ' ';
  if (name == "punct") return graph && !(upper || lower || digit);
  return std::nullopt;
}

// Reads the class that opens at p[open] == '[' into *out (negation applied,
// '/' left out). Returns the index past its closing ']', kNone if malformed.
size_t read_class(std::string_view p, size_t open, ByteSet* out) {
  size_t i = open + 1;
  const bool negated = i < p.size() && (p[i] == '!' || p[i] == '^');
  if (negated) ++i;
  ByteSet in{};
  // The last single byte added, which a following '-' makes a range's low
  // end; -1 right after a range or a [:name:].
  int low = -1;
  const size_t first = i;
  for (;;) {
    if (i >= p.size()) return kNone;
    const char c = p[i];
    if (c == ']' && i != first) break;
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t close = p.find(']', i + 2);
      if (close == kNone) return kNone;
      if (close > i + 2 && p[close - 1] == ':') {
        const std::string_view name = p.substr(i + 2, close - 1 - (i + 2));
        for (int b = 0; b < 0x80; ++b) {
          const std::optional<bool> yes = in_named(name, b);
          if (!yes) return kNone;
          if (*yes) put(in, b);
        }
        i = close + 1;
        low = -1;
        continue;
      }
      // No ":]" before the next ']': the '[' is an ordinary byte.
    }
    if (c == '-' && low >= 0 && i + 1 < p.size() && p[i + 1] != ']') {
      size_t at = i + 1;
      if (p[at] == '\\' && ++at >= p.size()) return kNone;
      const int high = static_cast<unsigned char>(p[at]);
      for (int b = low; b <= high; ++b) put(in, b);
      i = at + 1;
      low = -1;
      continue;
    }
    size_t at = i;
    if (c == '\\' && ++at >= p.size()) return kNone;
    low = static_cast<unsigned char>(p[at]);
    put(in, low);
    i = at + 1;
  }
  if (negated) {
    for (uint64_t& w : in) w = ~w;
  }
  in['/' >> 6] &= ~(uint64_t{1} << ('/' & 63));
  *out = in;
  return i + 1;
}

}  // namespace

Wildcard Wildcard::compile(std::string_view p) {
  Wildcard w;
  std::vector<uint8_t> loops(1, 0);  // per position: 0, 1 ('*') or 2 ("**")
  auto add_step = [&](uint16_t step) {
    w.steps_.push_back(step);
    loops.push_back(0);
  };
  for (size_t i = 0; i < p.size();) {
    switch (p[i]) {
      case '*': {
        const size_t end = std::min(p.find_first_not_of('*', i), p.size());
        loops.back() = std::max<uint8_t>(loops.back(), end - i > 1 ? 2 : 1);
        i = end;
        break;
      }
      case '?':
        add_step(kAnyButSlash);
        ++i;
        break;
      case '[': {
        ByteSet set;
        i = read_class(p, i, &set);
        if (i == kNone) return never();
        add_step(static_cast<uint16_t>(kFirstSet + w.sets_.size()));
        w.sets_.push_back(set);
        break;
      }
      case '\\':
        if (i + 1 == p.size()) return never();  // escapes nothing
        add_step(static_cast<unsigned char>(p[i + 1]));
        i += 2;
        break;
      default:
        add_step(static_cast<unsigned char>(p[i]));
        ++i;
        break;
    }
  }
  w.set_loops(loops);
  return w;
}

Wildcard Wildcard::literal(std::string_view text) {
  Wildcard w;
  for (char c : text) w.steps_.push_back(static_cast<unsigned char>(c));
  w.literal_ = true;
  w.set_loops(std::vector<uint8_t>(text.size() + 1, 0));
  return w;
}

Wildcard Wildcard::never() {
  Wildcard w;
  w.never_ = true;
  return w;
}

void Wildcard::set_loops(const std::vector<uint8_t>& loops) {
  const size_t words = steps_.size() / 64 + 1;
  loop_on_byte_.assign(words, 0);
  loop_on_slash_.assign(words, 0);
  for (size_t pos = 0; pos < loops.size(); ++pos) {
    const uint64_t bit = uint64_t{1} << (pos & 63);
    if (loops[pos] >= 1) loop_on_byte_[pos >> 6] |= bit;
    if (loops[pos] >= 2) loop_on_slash_[pos >> 6] |= bit;
  }
  // One word of positions: what every byte does, tabulated once.
  short_moves_.clear();
  if (words == 1 && !literal_) {
    short_moves_.resize(256);
    for (unsigned c = 0; c < 256; ++c)
      fill_moves(static_cast<uint8_t>(c), &short_moves_[c]);
  }
}

bool Wildcard::takes(uint16_t step, uint8_t c) const {
  if (step < 256) return step == c;
  if (step == kAnyButSlash) return c != '/';
  const ByteSet& s = sets_[step - kFirstSet];
  return (s[c >> 6] >> (c & 63)) & 1;
}

void Wildcard::fill_moves(uint8_t c, uint64_t* row) const {
  std::fill_n(row, loop_on_byte_.size(), 0);
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (takes(steps_[i], c)) row[(i + 1) >> 6] |= uint64_t{1} << ((i + 1) & 63);
  }
}

bool Wildcard::matches(std::initializer_list<std::string_view> text, Start start) const {
  if (never_) return false;
  size_t n = 0;
  for (std::string_view piece : text) n += piece.size();
  const size_t last = steps_.size();  // the position of a complete match
  if (n < last) return false;         // every step takes a byte
  const bool restart = start == Start::kAnyComponent;
  if (literal_ && !restart) {
    if (n != last) return false;
    size_t at = 0;
    for (std::string_view piece : text) {
      for (const char ch : piece) {
        if (steps_[at++] != static_cast<uint8_t>(ch)) return false;
      }
    }
    return true;
  }
  // All live positions advance at once: bit i of `live` (word i / 64 of it)
  // for position i.
  if (!short_moves_.empty()) {
    uint64_t live = 1;
    for (std::string_view piece : text) {
      for (const char ch : piece) {
        if (live == 0 && !restart) return false;
        const auto c = static_cast<uint8_t>(ch);
        const uint64_t loops = c == '/' ? loop_on_slash_[0] : loop_on_byte_[0];
        live = (live & loops) | ((live << 1) & short_moves_[c]);
        if (restart && c == '/') live |= 1;  // another try after each '/'
      }
    }
    return (live >> last) & 1;
  }
  // A long pattern: rows of `words` bits, two for the live positions before
  // and after a byte, then one per distinct byte of the text, made when it
  // first comes. After f bytes no position past f is live, so only the first
  // f / 64 + 1 words are looked at.
  const size_t words = loop_on_byte_.size();
  std::vector<uint64_t> rows(2 * words);
  rows.reserve((2 + std::min<size_t>(n, 256)) * words);
  int16_t row_of[256];
  std::fill(std::begin(row_of), std::end(row_of), int16_t{-1});
  size_t live = 0;  // offsets of the two rows in `rows`
  size_t next = words;
  rows[live] = 1;
  bool any = true;
  size_t fed = 0;
  for (std::string_view piece : text) {
    for (const char ch : piece) {
      const auto c = static_cast<uint8_t>(ch);
      const size_t used = std::min(words, ++fed / 64 + 1);
      if (!any) {
        // Nothing can match any more, unless a '/' starts another try.
        if (!restart) return false;
        if (c != '/') continue;
      }
      if (row_of[c] < 0) {
        row_of[c] = static_cast<int16_t>(rows.size() / words);
        rows.resize(rows.size() + words);  // within the reserve: no move
        fill_moves(c, &rows[rows.size() - words]);
      }
      const uint64_t* move = &rows[row_of[c] * words];
      const uint64_t* loops = (c == '/' ? loop_on_slash_ : loop_on_byte_).data();
      uint64_t carry = 0;  // the top bit of the word below, moving up
      uint64_t seen = 0;
      for (size_t w = 0; w < used; ++w) {
        const uint64_t now = rows[live + w];
        rows[next + w] = (now & loops[w]) | (((now << 1) | carry) & move[w]);
        carry = now >> 63;
        seen |= rows[next + w];
      }
      if (restart && c == '/') {
        rows[next] |= 1;
        seen = 1;
      }
      any = seen != 0;
      std::swap(live, next);
    }
  }
  return (rows[live + last / 64] >> (last & 63)) & 1;
}

}  // namespace rdmakit::cp
