// The rules' parsing, their wire encoding, and which part of a path each
// pattern is matched against (the wildcards themselves: wildcard.cpp),
// after rsync(1) and checked against the rsync binary
// (tests/cp/unit/filter_test.cpp).
#include "filter.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace rdmakit::cp {
namespace {

// The last n components of path, nullopt if it has fewer.
std::optional<std::string_view> last_components(std::string_view path, uint32_t n) {
  size_t cut = path.size();  // the tail so far starts after path[cut]
  for (uint32_t found = 0; found < n; ++found) {
    const size_t slash = cut == 0 ? std::string_view::npos : path.rfind('/', cut - 1);
    if (slash == std::string_view::npos) {
      if (found + 1 < n) return std::nullopt;
      return path;
    }
    cut = slash;
  }
  return path.substr(cut + 1);
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
  // Without '*', '?' or '[' a pattern is a plain string ('\' included).
  const bool wild = text.find_first_of("*?[") != std::string_view::npos;
  // rsync looks at the text, escapes or not: a "**" anywhere (even "\**")
  // makes the pattern one about the whole path.
  const bool any_depth = text.find("**") != std::string_view::npos;
  const bool anchored = text[0] == '/';
  if (anchored) {
    text.remove_prefix(1);
  } else if (text.starts_with("**")) {
    r.slash_before = true;
  } else if (any_depth) {
    r.scope = Scope::kAnySuffix;
  } else {
    // No "**": as many trailing components as the pattern has (one without
    // a '/': the name).
    r.scope = Scope::kTail;
    r.components = static_cast<uint32_t>(std::count(text.begin(), text.end(), '/')) + 1;
  }
  r.slash_after_dir = any_depth && text.ends_with("***");
  r.pattern = wild ? Wildcard::compile(text) : Wildcard::literal(text);
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

bool FilterRules::matches(const Rule& r, std::string_view path, bool is_dir) {
  if (path.starts_with('/')) path.remove_prefix(1);
  if (path.empty() || (r.dir_only && !is_dir)) return false;
  if (r.scope == Scope::kTail) {
    const std::optional<std::string_view> tail = last_components(path, r.components);
    if (!tail) return false;
    path = *tail;
  }
  const std::string_view before = r.slash_before ? "/" : "";
  const std::string_view after = r.slash_after_dir && is_dir ? "/" : "";
  return r.pattern.matches({before, path, after}, r.scope == Scope::kAnySuffix
                                                      ? Wildcard::Start::kAnyComponent
                                                      : Wildcard::Start::kText);
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
