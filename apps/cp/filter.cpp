// rsync's include/exclude matching, written afresh after the algorithm of
// its exclude.c (what a pattern is matched against) and wildmatch.c (the
// matcher, with its early aborts), and checked against the rsync binary
// (tests/cp/unit/filter_test.cpp).
// fnmatch(3) is not used: FNM_PATHNAME has no "**", and rsync's choice of
// what a pattern is matched against (last component, trailing components,
// any suffix after a '/') is not fnmatch's.
#include "filter.hpp"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace rdmakit::cp {
namespace {

using uchar = unsigned char;

// The results of rsync's wildmatch: besides match and mismatch, two ways to
// cut the backtracking short. kAbortAll: the text ran out, so no longer
// stretch of an earlier '*' can help. kAbortToStarStar: a '*' reached a '/',
// so only an enclosing "**" can help. They keep hostile patterns polynomial.
constexpr int kNoMatch = 0;
constexpr int kMatch = 1;
constexpr int kAbortAll = -1;
constexpr int kAbortToStarStar = -2;

// "[:name:]" against c (ASCII classes, as in the C locale); -1 for an
// unknown name, which rsync treats as a malformed pattern.
int named_class(std::string_view n, uchar c) {
  const bool a = c < 0x80;  // bytes past ASCII are in no class
  if (n == "alnum") return a && isalnum(c);
  if (n == "alpha") return a && isalpha(c);
  if (n == "blank") return a && isblank(c);
  if (n == "cntrl") return a && iscntrl(c);
  if (n == "digit") return a && isdigit(c);
  if (n == "graph") return a && isgraph(c);
  if (n == "lower") return a && islower(c);
  if (n == "print") return a && isprint(c);
  if (n == "punct") return a && ispunct(c);
  if (n == "space") return a && isspace(c);
  if (n == "upper") return a && isupper(c);
  if (n == "xdigit") return a && isxdigit(c);
  return -1;
}

// A "[...]" class; p is just past the '[' and is left on the closing ']'.
// A ']' right after "[", "[!" or "[^" is literal, and so is a '-' first or
// last; a class never matches '/'. kAbortAll when the class is unterminated.
int match_class(const uchar*& p, uchar c) {
  uchar pc = *p;
  const bool negate = pc == '!' || pc == '^';
  if (negate) pc = *++p;
  uchar prev = 0;
  bool matched = false;
  do {
    if (!pc) return kAbortAll;
    if (pc == '\\') {
      pc = *++p;
      if (!pc) return kAbortAll;
      if (c == pc) matched = true;
    } else if (pc == '-' && prev && p[1] && p[1] != ']') {
      pc = *++p;
      if (pc == '\\') {
        pc = *++p;
        if (!pc) return kAbortAll;
      }
      if (c >= prev && c <= pc) matched = true;
      pc = 0;  // a range's end does not start another range
    } else if (pc == '[' && p[1] == ':') {
      const uchar* s = p + 2;
      const uchar* e = s;
      while (*e && *e != ']') ++e;
      if (!*e) return kAbortAll;
      if (e - s < 1 || e[-1] != ':') {
        if (c == '[') matched = true;  // no ":]": a plain '['
      } else {
        const int m =
            named_class(std::string_view(reinterpret_cast<const char*>(s), e - s - 1), c);
        if (m < 0) return kAbortAll;
        if (m) matched = true;
        p = e;
        pc = 0;
      }
    } else if (c == pc) {
      matched = true;
    }
    prev = pc;
  } while ((pc = *++p) != ']');
  return matched != negate && c != '/' ? kMatch : kNoMatch;
}

// Pattern p (NUL-terminated) against t from index i to its end.
int dowild(const uchar* p, std::string_view t, size_t i) {
  for (; *p; ++p, ++i) {
    if (i == t.size() && *p != '*') return kAbortAll;
    const uchar c = i < t.size() ? static_cast<uchar>(t[i]) : 0;
    switch (*p) {
      case '\\':
        ++p;  // the next char literally; a trailing '\' matches nothing
        if (!*p || c != *p) return kNoMatch;
        break;
      case '?':
        if (c == '/') return kNoMatch;
        break;
      case '[': {
        ++p;
        const int m = match_class(p, c);
        if (m != kMatch) return m;
        break;
      }
      case '*': {
        const bool star2 = p[1] == '*';  // "**" (or more) crosses '/'
        while (*p == '*') ++p;
        if (!*p) {
          return star2 || t.find('/', i) == std::string_view::npos ? kMatch : kNoMatch;
        }
        for (; i < t.size(); ++i) {
          const int m = dowild(p, t, i);
          if (m != kNoMatch) {
            if (!star2 || m != kAbortToStarStar) return m;
          } else if (!star2 && t[i] == '/') {
            return kAbortToStarStar;
          }
        }
        return kAbortAll;
      }
      default:
        if (c != *p) return kNoMatch;
        break;
    }
  }
  return i == t.size() ? kMatch : kNoMatch;
}

// where > 0: match only the last `where` components of t; where < 0: match
// at the start or after any '/'; 0: at the start.
bool wild_array(const uchar* p, std::string_view t, int where) {
  size_t i = 0;
  if (where > 0) {
    size_t k = t.size();
    int n = where;
    while (k > 0 && !(t[k - 1] == '/' && --n == 0)) --k;
    if (k > 0) {
      i = k;
    } else if (n != 1) {
      return false;  // fewer components than the pattern has
    }
  }
  int m = dowild(p, t, i);
  if (m != kMatch && where < 0 && m != kAbortAll) {
    for (;;) {
      if (i == t.size()) return false;
      if (t[i++] == '/' && (m = dowild(p, t, i)) != kNoMatch && m != kAbortToStarStar) {
        break;
      }
    }
  }
  return m == kMatch;
}

// A rule's text for an error message, shortened.
std::string quoted(std::string_view s) {
  constexpr size_t kShown = 80;
  std::string q(1, '\'');  // appended piecewise: "'" + string trips GCC 12's -Wrestrict
  q.append(s.substr(0, kShown));
  q.append(s.size() > kShown ? "...'" : "'");
  return q;
}

void put32(std::vector<std::byte>& out, uint32_t v) {
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<std::byte>(v >> (8 * k)));
}

uint32_t get32(std::span<const std::byte> in, size_t at) {
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) v |= std::to_integer<uint32_t>(in[at + k]) << (8 * k);
  return v;
}

}  // namespace

std::string FilterRules::add_exclude(std::string_view pattern) {
  std::string err = add_text(pattern, false);
  return err.empty() ? err : "--exclude " + quoted(pattern) + ": " + err;
}

std::string FilterRules::add_include(std::string_view pattern) {
  std::string err = add_text(pattern, true);
  return err.empty() ? err : "--include " + quoted(pattern) + ": " + err;
}

// rsync's "old prefixes" mode, used for all four options: only "- " and
// "+ " are recognised, and "!" alone clears the list ("!x" is a pattern).
std::string FilterRules::add_text(std::string_view text, bool include) {
  if (text.empty()) return "";  // rsync ignores an empty rule
  if (text.size() >= 2 && text[1] == ' ' && (text[0] == '-' || text[0] == '+')) {
    include = text[0] == '+';
    text.remove_prefix(2);
    if (text.empty()) return "unexpected end of filter rule";
  } else if (text == "!") {
    rules_.clear();
    return "";
  }
  return add_rule(text, include);
}

// The pattern's properties, as rsync derives them when it adds a rule.
std::string FilterRules::add_rule(std::string_view text, bool include) {
  if (text.empty()) return "empty pattern";
  if (text.size() > kMaxFilterPattern) {
    return "pattern longer than " + std::to_string(kMaxFilterPattern) + " bytes";
  }
  if (text.find('\0') != std::string_view::npos) return "pattern contains a NUL byte";
  if (rules_.size() >= kMaxFilterRules) {
    return "more than " + std::to_string(kMaxFilterRules) + " filter rules";
  }
  Rule r;
  r.text = text;
  r.include = include;
  // A lone "/" stays a (never matching) anchored pattern, as in rsync.
  if (text.size() > 1 && text.back() == '/') {
    r.dir_only = true;
    text.remove_suffix(1);
  }
  r.pattern = text;
  for (char ch : text) r.slashes += ch == '/';
  r.wild = text.find_first_of("*?[") != std::string_view::npos;
  if (r.wild) {
    const size_t star2 = text.find("**");
    r.wild2 = star2 != std::string_view::npos;
    r.wild2_prefix = star2 == 0;
    r.wild3_suffix = r.wild2 && text.ends_with("***");
  }
  rules_.push_back(std::move(r));
  return "";
}

std::string FilterRules::add_from_file(const std::string& path, bool include) {
  const char* what = include ? "include" : "exclude";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    return std::string("failed to open ") + what + " file " + path + ": " +
           std::strerror(errno);
  }
  // Rules go to a copy, kept only if the whole file parses.
  FilterRules next = *this;
  std::string line, err;
  size_t lineno = 1;
  bool too_long = false;
  for (;;) {
    const int c = std::getc(f);
    if (c != EOF && c != '\n' && c != '\r') {
      // Room for a "- " prefix; longer lines are an error, not truncated.
      if (line.size() < kMaxFilterPattern + 2) {
        line.push_back(static_cast<char>(c));
      } else {
        too_long = true;
      }
      continue;
    }
    if (c == '\r') {  // CRLF is one line end
      const int n = std::getc(f);
      if (n != '\n' && n != EOF) std::ungetc(n, f);
    }
    if (too_long) {
      err = "line longer than " + std::to_string(kMaxFilterPattern + 2) + " bytes";
    } else if (!line.empty() && line[0] != ';' && line[0] != '#') {
      err = next.add_text(line, include);
    }
    if (!err.empty() || c == EOF) break;
    line.clear();
    ++lineno;
  }
  if (err.empty() && std::ferror(f))
    err = std::string("read error: ") + std::strerror(errno);
  std::fclose(f);
  if (!err.empty())
    return std::string(what) + " file " + path + ":" + std::to_string(lineno) + ": " +
           err;
  *this = std::move(next);
  return "";
}

bool FilterRules::matches(const Rule& r, std::string_view fname, bool is_dir) {
  const bool rooted = !fname.empty() && fname[0] == '/';
  std::string_view name = fname.substr(rooted ? 1 : 0);
  if (name.empty()) return false;
  if (r.dir_only && !is_dir) return false;
  // No '/' and no "**": the pattern is about the last component only.
  if (r.slashes == 0 && !r.wild2) {
    const size_t s = name.rfind('/');
    if (s != std::string_view::npos) name.remove_prefix(s + 1);
  }
  const bool anchored = r.pattern[0] == '/';
  const char* pat = r.pattern.c_str() + (anchored ? 1 : 0);
  if (!r.wild) {
    const std::string_view lit(pat);
    if (anchored) return name == lit;
    // Unanchored: a whole-component suffix of the path.
    return name.ends_with(lit) &&
           (name.size() == lit.size() || name[name.size() - lit.size() - 1] == '/');
  }
  int where = 0;
  if (!anchored && r.slashes && !r.wild2) {
    where = static_cast<int>(r.slashes) + 1;  // the last slashes+1 components
  } else if (!anchored && !r.wild2_prefix && r.wild2) {
    where = -1;  // after any '/'
  }
  // A leading "**/" also matches at the top ("**/x" matches "x"), and
  // "dir/***" also matches "dir" itself: rsync adds the missing '/'.
  const bool prefix = r.wild2_prefix && !rooted;
  const bool suffix = is_dir && r.wild3_suffix;
  std::string buf;
  if (prefix || suffix) {
    buf.reserve(name.size() + 2);
    if (prefix) buf += '/';
    buf += name;
    if (suffix) buf += '/';
    name = buf;
  }
  return wild_array(reinterpret_cast<const uchar*>(pat), name, where);
}

FilterVerdict FilterRules::verdict(std::string_view wire_path, bool is_dir) const {
  for (const Rule& r : rules_) {
    if (matches(r, wire_path, is_dir)) {
      return r.include ? FilterVerdict::kInclude : FilterVerdict::kExclude;
    }
  }
  return FilterVerdict::kNone;
}

std::vector<std::byte> FilterRules::encode() const {
  std::vector<std::byte> out;
  put32(out, static_cast<uint32_t>(rules_.size()));
  for (const Rule& r : rules_) {
    out.push_back(static_cast<std::byte>(r.include ? 1 : 0));
    put32(out, static_cast<uint32_t>(r.text.size()));
    for (char ch : r.text) out.push_back(static_cast<std::byte>(ch));
  }
  return out;
}

bool FilterRules::decode(std::span<const std::byte> in, FilterRules* out,
                         std::string* why) {
  auto fail = [why](std::string reason) {
    if (why) *why = "filter rules: " + std::move(reason);
    return false;
  };
  if (!out) return fail("nowhere to decode to");
  size_t at = 0;
  auto left = [&] { return in.size() - at; };
  if (left() < 4) return fail("truncated before the rule count");
  const uint32_t count = get32(in, at);
  at += 4;
  if (count > kMaxFilterRules) {
    return fail(std::to_string(count) + " rules, at most " +
                std::to_string(kMaxFilterRules));
  }
  // Each rule is re-added (and so re-checked) from its text; memory grows
  // only with bytes actually present in `in`.
  FilterRules rules;
  for (uint32_t k = 0; k < count; ++k) {
    const std::string at_rule = "rule " + std::to_string(k) + ": ";
    if (left() < 5) return fail(at_rule + "truncated header");
    const auto type = std::to_integer<uint8_t>(in[at]);
    const uint32_t len = get32(in, at + 1);
    at += 5;
    if (type > 1) return fail(at_rule + "unknown type " + std::to_string(type));
    if (len == 0 || len > kMaxFilterPattern) {
      return fail(at_rule + "pattern length " + std::to_string(len) + " not in 1.." +
                  std::to_string(kMaxFilterPattern));
    }
    if (left() < len) return fail(at_rule + "truncated pattern");
    const std::string_view text(reinterpret_cast<const char*>(in.data() + at), len);
    at += len;
    if (std::string err = rules.add_rule(text, type == 1); !err.empty()) {
      return fail(at_rule + err);
    }
  }
  if (left() != 0) return fail(std::to_string(left()) + " trailing bytes");
  *out = std::move(rules);
  return true;
}

}  // namespace rdmakit::cp
