#pragma once
// rsync-compatible include/exclude rules (rsync(1) "FILTER RULES" and
// "INCLUDE/EXCLUDE PATTERN RULES"): --exclude, --include, --exclude-from and
// --include-from, matched the way rsync's sender matches them, so that a
// rule set gives the same file list as `rsync -r RULES SRC DST/`.
//
// Supported: "- "/"+ " prefixes (in options and in files), "!" (clears the
// rules given so far), leading '/' (anchored at the transfer root), trailing
// '/' (directories only), '*', '**', '?', '[...]' (with '!'/'^', ranges and
// [:class:]), backslash escapes and a trailing "***". Not supported: the
// long filter syntax (--filter, merge and dir-merge rules, modifiers).
//
// Wire encoding (little-endian), as sent to the peer:
//   u32 rule count (<= kMaxFilterRules), then per rule:
//   u8 type (0 exclude, 1 include), u32 length (1..kMaxFilterPattern),
//   that many pattern bytes (no NUL), as given after any "- "/"+ " prefix.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wildcard.hpp"

namespace rdmakit::cp {

// Bounds on a rule list, local or decoded from a peer.
inline constexpr uint32_t kMaxFilterRules = 4096;
inline constexpr uint32_t kMaxFilterPattern = 4096;

enum class FilterVerdict : uint8_t { kNone, kInclude, kExclude };

class FilterRules {
 public:
  // --exclude PATTERN / --include PATTERN, in command-line order. As in
  // rsync, a "- " or "+ " prefix overrides the option's type, "!" clears the
  // list and an empty pattern is ignored. Returns "" or an error text.
  std::string add_exclude(std::string_view pattern);
  std::string add_include(std::string_view pattern);
  // --exclude-from FILE / --include-from FILE. One rule a line (LF, CR or
  // CRLF); empty lines and lines starting with ';' or '#' are skipped; other
  // whitespace is part of the pattern, as in rsync. All or nothing: on an
  // error (naming the file and line) no rule of the file is added.
  std::string add_from_file(const std::string& path, bool include);

  // The first matching rule's type (rsync order), kNone if none matches.
  // wire_path is relative, '/'-separated, starting with the top-level
  // source's name. Parents are not checked: the walk does not descend into
  // an excluded directory.
  FilterVerdict verdict(std::string_view wire_path, bool is_dir) const;
  bool excluded(std::string_view wire_path, bool is_dir) const {
    return verdict(wire_path, is_dir) == FilterVerdict::kExclude;
  }
  bool empty() const { return rules_.empty(); }
  size_t size() const { return rules_.size(); }

  std::vector<std::byte> encode() const;
  // Treats `in` as hostile: false with *why (if not null) on anything
  // malformed or out of bounds, *out untouched then.
  static bool decode(std::span<const std::byte> in, FilterRules* out, std::string* why);

 private:
  // The part of a path a rule's pattern must match in full.
  enum class Scope : uint8_t {
    kWhole,      // all of it (an anchored pattern, or one starting with "**")
    kTail,       // its last `components` components
    kAnySuffix,  // all of it or what follows any '/' in it (a later "**")
  };
  struct Rule {
    std::string text;  // as given (after the prefix): what encode() sends
    Wildcard pattern;  // without a leading '/' and a trailing '/'
    bool include = false;
    bool dir_only = false;  // text ended with '/'
    Scope scope = Scope::kWhole;
    uint32_t components = 0;  // kTail
    // A leading "**": the path is matched with a '/' before it, so that
    // "**/x" also matches x at the top.
    bool slash_before = false;
    // A trailing "***": a directory is matched with a '/' after it, so that
    // "dir/***" matches dir itself too.
    bool slash_after_dir = false;
  };

  // One option argument or file line: prefixes, "!", then add_rule.
  std::string add_text(std::string_view text, bool include);
  std::string add_rule(std::string_view pattern, bool include);
  static bool matches(const Rule& r, std::string_view fname, bool is_dir);

  std::vector<Rule> rules_;
};

}  // namespace rdmakit::cp
