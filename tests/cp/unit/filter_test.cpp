// The include/exclude rules: each rule form on its own, whole rule sets
// against the rsync binary (the oracle: same tree, same rules, same list of
// names), the rule files, and the decoder of a peer's rules.
#include "filter.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

extern char** environ;

namespace rdmakit::cp {
namespace {

namespace fs = std::filesystem;

// One exclude rule against one path.
bool ex(std::string_view pattern, std::string_view path, bool dir = false) {
  FilterRules r;
  EXPECT_EQ(r.add_exclude(pattern), "");
  return r.excluded(path, dir);
}

// A temp dir removed at the end of its scope.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string tmpl =
        std::string(base && *base ? base : "/tmp") + "/rdmakit-filter-XXXXXX";
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, std::string_view body) {
  std::ofstream(path, std::ios::binary) << body;
}

TEST(CpFilterMatch, NameOnlyPatternMatchesTheLastComponent) {
  EXPECT_TRUE(ex("*.o", "p/a.o"));
  EXPECT_TRUE(ex("*.o", "p/x/y/a.o"));
  EXPECT_FALSE(ex("*.o", "p/a.o/b"));
  EXPECT_TRUE(ex("build", "p/x/build"));
  EXPECT_TRUE(ex("build", "p/x/build", true));
  EXPECT_FALSE(ex("build", "p/xbuild"));
  EXPECT_FALSE(ex("build", "p/build/x"));
  EXPECT_TRUE(ex("p", "p", true));  // the top itself
}

TEST(CpFilterMatch, LeadingSlashAnchorsAtTheTransferRoot) {
  EXPECT_TRUE(ex("/p/build", "p/build", true));
  EXPECT_FALSE(ex("/p/build", "p/x/p/build", true));
  EXPECT_FALSE(ex("/build", "p/build"));
  EXPECT_TRUE(ex("/p", "p", true));
  EXPECT_TRUE(ex("/p/*.c", "p/a.c"));
  EXPECT_FALSE(ex("/p/*.c", "p/x/a.c"));
  EXPECT_FALSE(ex("/", "p", true));  // a lone "/" matches nothing
}

TEST(CpFilterMatch, TrailingSlashMatchesOnlyDirectories) {
  EXPECT_TRUE(ex("build/", "p/build", true));
  EXPECT_FALSE(ex("build/", "p/build", false));
  EXPECT_TRUE(ex("x/build/", "p/x/build", true));
  EXPECT_FALSE(ex("x/build/", "p/x/build", false));
  EXPECT_TRUE(ex("*/", "p/a", true));
  EXPECT_FALSE(ex("*/", "p/a", false));
  EXPECT_TRUE(ex("/p/", "p", true));
}

TEST(CpFilterMatch, InfixSlashMatchesTrailingWholeComponents) {
  EXPECT_TRUE(ex("foo/bar", "foo/bar"));
  EXPECT_TRUE(ex("foo/bar", "p/foo/bar"));
  EXPECT_TRUE(ex("foo/bar", "p/x/y/foo/bar"));
  EXPECT_FALSE(ex("foo/bar", "p/xfoo/bar"));
  EXPECT_FALSE(ex("foo/bar", "p/foo/bar/z"));
  EXPECT_TRUE(ex("foo/*.c", "p/q/foo/a.c"));
  EXPECT_FALSE(ex("foo/*.c", "p/foo/q/a.c"));  // '*' stops at '/'
  EXPECT_FALSE(ex("a/b/c", "b/c"));            // fewer components
}

TEST(CpFilterMatch, SingleStarAndQuestionMarkStopAtSlashes) {
  EXPECT_TRUE(ex("?.c", "p/a.c"));
  EXPECT_FALSE(ex("?.c", "p/ab.c"));
  EXPECT_FALSE(ex("p?x", "p/x"));  // no '/' in it: the last component only
  EXPECT_FALSE(ex("/p?x", "p/x"));
  EXPECT_TRUE(ex("/p/*", "p/x", true));
  EXPECT_FALSE(ex("/p/*", "p/x/y"));
  EXPECT_TRUE(ex("a*b*c", "p/aXbYc"));
  EXPECT_TRUE(ex("*", "p/anything"));
}

TEST(CpFilterMatch, DoubleStarCrossesSlashes) {
  EXPECT_TRUE(ex("/p/**", "p/a/b/c"));
  EXPECT_FALSE(ex("/p/**", "p", true));
  EXPECT_TRUE(ex("src/**", "p/src/a"));
  EXPECT_TRUE(ex("src/**", "p/x/src/a/b"));
  EXPECT_FALSE(ex("src/**", "p/src", true));
  EXPECT_TRUE(ex("a/**/c", "p/a/b/c"));
  EXPECT_TRUE(ex("a/**/c", "p/a/b/d/c"));
  EXPECT_FALSE(ex("a/**/c", "p/a/c"));  // "**/" needs a '/' of its own
  EXPECT_TRUE(ex("**/c", "c"));         // except at the very start
  EXPECT_TRUE(ex("**/c", "p/a/c"));
  EXPECT_TRUE(ex("**.o", "p/a/b.o"));
  EXPECT_TRUE(ex("**", "p", true));
}

TEST(CpFilterMatch, TripleStarSuffixMatchesTheDirAndItsContents) {
  EXPECT_TRUE(ex("lib/***", "p/lib", true));
  EXPECT_TRUE(ex("lib/***", "p/lib/a"));
  EXPECT_TRUE(ex("lib/***", "p/x/lib/a/b", true));
  EXPECT_FALSE(ex("lib/***", "p/lib", false));  // a file named lib
  EXPECT_FALSE(ex("lib/***", "p/xlib", true));
  EXPECT_TRUE(ex("/p/lib/***", "p/lib", true));
  EXPECT_FALSE(ex("/p/lib/***", "p/x/lib", true));
}

TEST(CpFilterMatch, CharacterClasses) {
  EXPECT_TRUE(ex("[ab].c", "p/a.c"));
  EXPECT_FALSE(ex("[ab].c", "p/c.c"));
  EXPECT_TRUE(ex("[a-c].c", "p/b.c"));
  EXPECT_FALSE(ex("[a-c].c", "p/d.c"));
  EXPECT_TRUE(ex("[!a-c].c", "p/d.c"));
  EXPECT_FALSE(ex("[!a-c].c", "p/a.c"));
  EXPECT_TRUE(ex("[^a].c", "p/b.c"));
  EXPECT_FALSE(ex("[^a].c", "p/a.c"));
  EXPECT_TRUE(ex("[]]x", "p/]x"));   // ']' first is literal
  EXPECT_TRUE(ex("[a-]x", "p/-x"));  // '-' last is literal
  EXPECT_TRUE(ex("[[:digit:]]*", "p/1.c"));
  EXPECT_FALSE(ex("[[:digit:]]*", "p/a1"));
  EXPECT_TRUE(ex("[[:upper:][:space:]]", "p/ "));
  EXPECT_FALSE(ex("[[:bogus:]]", "p/b"));  // unknown class: never matches
  EXPECT_FALSE(ex("[ab", "p/a"));          // unterminated: never matches
  EXPECT_FALSE(ex("/p[!x]x", "p/x"));      // a class never matches '/'
  EXPECT_TRUE(ex("br[ack]et.c", "p/brcet.c"));
  EXPECT_FALSE(ex("br[ack]et.c", "p/br[ack]et.c"));
}

TEST(CpFilterMatch, ClassCorners) {
  // Each as the rsync binary has it.
  EXPECT_TRUE(ex("[a-c-e]", "p/b"));
  EXPECT_TRUE(ex("[a-c-e]", "p/-"));  // a range's end starts no range
  EXPECT_TRUE(ex("[a-c-e]", "p/e"));
  EXPECT_FALSE(ex("[a-c-e]", "p/d"));
  EXPECT_TRUE(ex("[[:alpha:]-z]", "p/-"));  // nor does a [:class:]
  EXPECT_TRUE(ex("[]-a]", "p/^"));          // a first ']' can
  EXPECT_TRUE(ex("[\\]]", "p/]"));
  EXPECT_TRUE(ex("[[:]x]", "p/:x]"));  // no ":]" after "[:": a plain '['
  EXPECT_TRUE(ex("[[:]x]", "p/[x]"));
  EXPECT_TRUE(ex("[z-a]", "p/z"));  // a reversed range is empty
  EXPECT_FALSE(ex("[z-a]", "p/a"));
  EXPECT_TRUE(ex("[!]a]", "p/b"));
  EXPECT_FALSE(ex("[!]a]", "p/]"));
  EXPECT_TRUE(ex("[^[:lower:]]", "p/A"));
  EXPECT_FALSE(ex("[^[:lower:]]", "p/a"));
  EXPECT_FALSE(ex("[[:alpha:]]", "p/\xe9"));  // classes are ASCII only
  EXPECT_FALSE(ex("[[::]]", "p/:"));          // an empty name is unknown
}

TEST(CpFilterMatch, LongPatternsAndPaths) {
  // More than 64 steps and bytes: the matcher's state spans several words.
  std::string path = "p", exact = "/p", wild = "/p", tail;
  for (int k = 0; k < 40; ++k) {
    const std::string n = std::to_string(k);  // appended piecewise: GCC 12's -Wrestrict
    path.append("/d").append(n);
    exact.append("/d").append(n);
    wild.append(k % 3 ? "/?" : "/*").append(k % 3 ? n : "");
    if (k >= 20) tail.append(tail.empty() ? "d" : "/d").append(n);
  }
  EXPECT_TRUE(ex(exact, path));
  EXPECT_TRUE(ex(wild, path));
  EXPECT_FALSE(ex(wild + "/*", path));
  EXPECT_TRUE(ex(tail, path));  // the last 20 components
  EXPECT_FALSE(ex("d1" + tail.substr(3), path));
  EXPECT_TRUE(ex("**/d1?/**/d39", path));
  EXPECT_FALSE(ex("**/d1?/**/d40", path));
  const std::string name(300, 'x');
  EXPECT_TRUE(ex(std::string(299, '?') + "*", "p/" + name));
  EXPECT_TRUE(ex(std::string(300, '?'), "p/" + name));
  EXPECT_FALSE(ex(std::string(301, '?'), "p/" + name));
  EXPECT_TRUE(ex("*" + std::string(200, 'x') + "*" + std::string(99, 'x'), "p/" + name));
  EXPECT_FALSE(
      ex("*" + std::string(200, 'x') + "*" + std::string(101, 'x'), "p/" + name));
}

TEST(CpFilterMatch, BackslashEscapesAWildcard) {
  EXPECT_TRUE(ex("a\\*", "p/a*"));
  EXPECT_FALSE(ex("a\\*", "p/ab"));
  EXPECT_TRUE(ex("br\\[ack\\]et.c", "p/br[ack]et.c"));
  EXPECT_FALSE(ex("br\\[ack\\]et.c", "p/brcet.c"));
  EXPECT_TRUE(ex("\\?x*", "p/?xy"));
  EXPECT_FALSE(ex("x*\\", "p/x\\"));  // a trailing '\' with a wildcard
  // Without '*', '?' or '[' the pattern is a literal: a '\' is itself.
  EXPECT_TRUE(ex("a\\b", "p/a\\b"));
}

TEST(CpFilterMatch, FirstMatchingRuleWins) {
  FilterRules r;
  ASSERT_EQ(r.add_include("*.c"), "");
  ASSERT_EQ(r.add_include("*/"), "");
  ASSERT_EQ(r.add_exclude("*"), "");
  EXPECT_EQ(r.verdict("p/a.c", false), FilterVerdict::kInclude);
  EXPECT_EQ(r.verdict("p/x", true), FilterVerdict::kInclude);
  EXPECT_EQ(r.verdict("p/a.h", false), FilterVerdict::kExclude);
  FilterRules none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.verdict("p/a.c", false), FilterVerdict::kNone);
  EXPECT_FALSE(none.excluded("p/a.c", false));
}

TEST(CpFilterParse, PrefixesClearAndErrors) {
  FilterRules r;
  EXPECT_EQ(r.add_exclude("+ *.c"), "");  // "+ " overrides --exclude
  EXPECT_EQ(r.add_include("- *.h"), "");  // "- " overrides --include
  EXPECT_EQ(r.verdict("p/a.c", false), FilterVerdict::kInclude);
  EXPECT_EQ(r.verdict("p/a.h", false), FilterVerdict::kExclude);
  EXPECT_EQ(r.add_exclude(""), "");  // ignored, as by rsync
  EXPECT_EQ(r.size(), 2u);
  EXPECT_EQ(r.add_exclude("!"), "");  // clears
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.add_exclude("!x"), "");  // a pattern
  EXPECT_TRUE(r.excluded("p/!x", false));
  EXPECT_EQ(r.add_exclude("- !"), "");  // a pattern too
  EXPECT_EQ(r.size(), 2u);
  EXPECT_NE(r.add_exclude("- ").find("unexpected end of filter rule"), std::string::npos);
  EXPECT_NE(r.add_include(std::string_view("a\0b", 3)), "");
  EXPECT_NE(r.add_exclude(std::string(kMaxFilterPattern + 1, 'a')), "");
  EXPECT_EQ(r.add_exclude(std::string(kMaxFilterPattern, 'a')), "");
  EXPECT_EQ(r.size(), 3u);
  FilterRules full;
  for (uint32_t k = 0; k < kMaxFilterRules; ++k) ASSERT_EQ(full.add_exclude("x"), "");
  EXPECT_NE(full.add_exclude("x"), "");
}

TEST(CpFilterParse, RuleFiles) {
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string file = tmp.path() + "/rules";
  write_file(file, "# comment\n; comment\n\n+ *.c\r\n- *.h\r*.o\n*.txt \n");
  FilterRules r;
  ASSERT_EQ(r.add_from_file(file, true), "");
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(r.verdict("p/a.c", false), FilterVerdict::kInclude);
  EXPECT_EQ(r.verdict("p/a.h", false), FilterVerdict::kExclude);
  EXPECT_EQ(r.verdict("p/a.o", false), FilterVerdict::kInclude);  // the option's type
  EXPECT_EQ(r.verdict("p/a.txt", false), FilterVerdict::kNone);   // "*.txt " has a space
  EXPECT_EQ(r.verdict("p/a.txt ", false), FilterVerdict::kInclude);

  // An error names the file and line, and adds nothing.
  write_file(file, "*.o\n\n- \n");
  std::string err = r.add_from_file(file, false);
  EXPECT_NE(err.find(file + ":3:"), std::string::npos) << err;
  EXPECT_EQ(r.size(), 4u);
  write_file(file, "*.o\n" + std::string(kMaxFilterPattern + 3, 'x') + "\n");
  err = r.add_from_file(file, false);
  EXPECT_NE(err.find(file + ":2:"), std::string::npos) << err;
  EXPECT_EQ(r.size(), 4u);
  err = r.add_from_file(tmp.path() + "/missing", false);
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  EXPECT_NE(r.add_from_file(tmp.path(), false), "");  // a directory: read error
  // "!" in a file clears everything before it, command-line rules too.
  write_file(file, "!\n*.x");
  ASSERT_EQ(r.add_from_file(file, false), "");
  EXPECT_EQ(r.size(), 1u);
}

TEST(CpFilterMatch, HostilePatternsStayFast) {
  // Many stars that cannot all fit: the matcher never backtracks.
  std::string star1, star2;
  for (int k = 0; k < 1000; ++k) star1 += "*a", star2 += "**a";
  star1 += "b";
  star2 += "b";
  const std::string path = "p/" + std::string(4000, 'a');
  const std::string slashy = "p/" + [] {
    std::string s;
    for (int k = 0; k < 1000; ++k) s += "a/a/";
    return s;
  }();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ex(star1, path));
  EXPECT_FALSE(ex(star2, path));
  EXPECT_FALSE(ex(star1, slashy));
  EXPECT_FALSE(ex(star2, slashy));
  EXPECT_FALSE(ex("/" + star2, slashy));
  EXPECT_FALSE(
      ex("**" + star1, "p/" + std::string(2000, 'a') + "/" + std::string(2000, 'a')));
  EXPECT_FALSE(ex("**/" + star1, slashy));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(CpFilterMatch, LongestPatternsOnLongestPathsDoNotBacktrack) {
  // kMaxFilterPattern bytes of hostile pattern against a 4096-byte path:
  // the matcher never backtracks, so each match is a bounded amount of work.
  auto fill = [](std::string_view unit, size_t len) {
    std::string s;
    while (s.size() < len) s += unit;
    s.resize(len);
    return s;
  };
  constexpr size_t kLen = kMaxFilterPattern;
  std::string bytes;  // 254 distinct bytes: the most rows for the matcher
  for (size_t k = 0; bytes.size() < kLen - 2; ++k) {
    const char c = static_cast<char>(1 + k % 255);
    if (c != '/') bytes += c;
  }
  const std::string flat = "p/" + std::string(kLen - 2, 'a');
  const std::string deep = fill("a/", kLen - 1) + "b";  // ends in "a/ab"
  const std::string mixed = "p/" + bytes;
  struct Case {
    std::string pattern, path;
    bool want;
  };
  const Case cases[] = {
      {fill("*a", kLen - 1) + "b", flat, false},
      {fill("*a", kLen), flat, true},
      {fill("*a", kLen - 1) + "b", deep, false},
      {fill("**a", kLen - 1) + "b", flat, false},
      {fill("**a", kLen - 1) + "b", deep, true},
      {"/" + fill("**a", kLen - 2) + "b", deep, true},
      {"/" + fill("**a", kLen - 2) + "c", deep, false},
      {"a" + fill("**a", kLen - 2) + "c", deep, false},
      {"***" + fill("/a", kLen - 4) + "b", deep, true},
      {"*" + std::string(kLen - 2, 'a') + "b", flat, false},
      {fill("?*", kLen - 1) + "b", flat, false},
      {fill("[a]*", kLen - 1) + "b", flat, false},
      {fill("*a/", kLen - 1) + "*", deep, true},
      {fill("*a/", kLen - 1) + "c", deep, false},
      {fill("?", kLen - 3) + "**?", mixed, true},
      {fill("[!x]", kLen - 4) + "*?**", mixed, false},
      {fill("*[[:alpha:]]", kLen - 4) + "****", mixed, true},
      {fill("*[[:alpha:]]", kLen - 4) + "***b", mixed, false},
  };
  auto slowest = std::chrono::steady_clock::duration::zero();
  for (const Case& c : cases) {
    ASSERT_EQ(c.pattern.size(), kLen);
    ASSERT_EQ(c.path.size(), 4096u);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(ex(c.pattern, c.path), c.want) << c.pattern.substr(0, 12);
    const auto took = std::chrono::steady_clock::now() - t0;
    // A guard against backtracking, not a speed test: an exponential
    // matcher takes minutes on these; a linear one milliseconds, under a
    // sanitizer on a loaded machine tens of them.
    EXPECT_LT(took, std::chrono::seconds(2)) << c.pattern.substr(0, 12);
    slowest = std::max(slowest, took);
  }
  RecordProperty(
      "slowest_match_us",
      std::to_string(
          std::chrono::duration_cast<std::chrono::microseconds>(slowest).count()));
}

// --- the wire encoding ------------------------------------------------------

FilterRules sample_rules() {
  FilterRules r;
  EXPECT_EQ(r.add_include("*.c"), "");
  EXPECT_EQ(r.add_include("*/"), "");
  EXPECT_EQ(r.add_exclude("- + x"), "");  // pattern "+ x": must not become an include
  EXPECT_EQ(r.add_exclude("/p/lib/***"), "");
  EXPECT_EQ(r.add_exclude("*"), "");
  return r;
}

TEST(CpFilterWire, RoundTrips) {
  const FilterRules r = sample_rules();
  const std::vector<std::byte> wire = r.encode();
  FilterRules back;
  std::string why;
  ASSERT_TRUE(FilterRules::decode(wire, &back, &why)) << why;
  EXPECT_EQ(back.encode(), wire);
  EXPECT_EQ(back.size(), r.size());
  for (const auto& [path, dir] :
       std::vector<std::pair<std::string, bool>>{{"p/a.c", false},
                                                 {"p/x", true},
                                                 {"p/+ x", false},
                                                 {"p/lib", true},
                                                 {"p/lib/a.c", false},
                                                 {"p/a.h", false},
                                                 {"p", true}}) {
    EXPECT_EQ(back.verdict(path, dir), r.verdict(path, dir)) << path;
  }
  FilterRules empty;
  ASSERT_TRUE(FilterRules::decode(empty.encode(), &back, &why)) << why;
  EXPECT_TRUE(back.empty());
}

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

void expect_refused(std::span<const std::byte> in, std::string_view what) {
  FilterRules out = sample_rules();
  std::string why;
  EXPECT_FALSE(FilterRules::decode(in, &out, &why)) << what;
  EXPECT_FALSE(why.empty()) << what;
  EXPECT_EQ(out.size(), sample_rules().size()) << what << ": output touched";
}

TEST(CpFilterWire, RefusesTruncatedInput) {
  const std::vector<std::byte> wire = sample_rules().encode();
  for (size_t n = 0; n < wire.size(); ++n) {
    expect_refused(std::span(wire).first(n), "truncated at " + std::to_string(n));
  }
}

TEST(CpFilterWire, RefusesOversizedAndMalformed) {
  expect_refused(bytes({0x01, 0x10, 0, 0}), "4097 rules");
  expect_refused(bytes({0xff, 0xff, 0xff, 0xff}), "2^32-1 rules");
  expect_refused(bytes({1, 0, 0, 0, 0, 0x01, 0x10, 0, 0}), "pattern of 4097");
  expect_refused(bytes({1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}), "pattern of 2^32-1");
  expect_refused(bytes({1, 0, 0, 0, 0, 0, 0, 0, 0}), "empty pattern");
  expect_refused(bytes({1, 0, 0, 0, 2, 1, 0, 0, 0, 'x'}), "unknown type");
  expect_refused(bytes({1, 0, 0, 0, 0, 3, 0, 0, 0, 'a', 0, 'b'}), "NUL in pattern");
  expect_refused(bytes({1, 0, 0, 0, 0, 1, 0, 0, 0, 'x', 0}), "trailing byte");
  expect_refused(bytes({0, 0, 0, 0, 0}), "trailing byte after none");
  std::string why;
  EXPECT_FALSE(FilterRules::decode({}, nullptr, &why));
  // The limits themselves are accepted.
  std::vector<std::byte> big = bytes({0x00, 0x10, 0, 0});
  for (uint32_t k = 0; k < kMaxFilterRules; ++k) {
    const std::vector<std::byte> rule = bytes({0, 1, 0, 0, 0, 'x'});
    big.insert(big.end(), rule.begin(), rule.end());
  }
  FilterRules out;
  EXPECT_TRUE(FilterRules::decode(big, &out, &why)) << why;
  EXPECT_EQ(out.size(), kMaxFilterRules);
}

TEST(CpFilterWire, GarbageNeverCrashes) {
  // Random buffers and random damage to a valid one (a fixed seed).
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&s] {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  };
  const std::vector<std::byte> valid = sample_rules().encode();
  for (int round = 0; round < 20000; ++round) {
    std::vector<std::byte> in;
    if (round % 2) {
      in = valid;
      for (int k = 0, n = 1 + next() % 4; k < n; ++k) {
        in[next() % in.size()] = static_cast<std::byte>(next());
      }
    } else {
      in.resize(next() % 48);
      for (auto& b : in) b = static_cast<std::byte>(next() % 4 ? next() % 8 : next());
    }
    FilterRules out;
    std::string why;
    if (!FilterRules::decode(in, &out, &why)) {
      EXPECT_FALSE(why.empty());
    } else {
      EXPECT_EQ(out.encode(), in);  // accepted input is canonical
    }
  }
}

// --- against rsync ------------------------------------------------------------

// One option: --exclude/--include PATTERN, or --exclude-from/--include-from
// a file with this body.
struct Arg {
  enum Kind { kExclude, kInclude, kExcludeFrom, kIncludeFrom } kind;
  std::string text;
};
struct RuleSet {
  const char* name;
  std::vector<Arg> args;
};
void PrintTo(const RuleSet& s, std::ostream* os) { *os << s.name; }
Arg X(std::string t) { return {Arg::kExclude, std::move(t)}; }
Arg I(std::string t) { return {Arg::kInclude, std::move(t)}; }
Arg XF(std::string t) { return {Arg::kExcludeFrom, std::move(t)}; }
Arg IF(std::string t) { return {Arg::kIncludeFrom, std::move(t)}; }

const RuleSet kRuleSets[] = {
    {"Suffix", {X("*.o")}},
    {"NameFilesAndDirs", {X("build")}},
    {"DirOnly", {X("build/")}},
    {"AnchoredAtTop", {X("/proj/build"), X("/proj/*.c")}},
    {"AnchoredNotTop", {X("/build"), X("/src"), X("/proj/src/lib/")}},
    {"AnchoredStarAtEnd", {X("/proj/b*")}},
    {"AnchoredStarDir", {X("/proj/*/")}},
    {"InfixSlash", {X("foo/bar")}},
    {"InfixSlashDirOnly", {X("foo/bar/"), X("src/build")}},
    {"InfixStar", {X("src/*/"), X("*/cache")}},
    {"DoubleStarSuffix", {X("src/**")}},
    {"DoubleStarPrefix", {X("**/build/*.o"), X("**.md")}},
    {"DoubleStarDirOnly", {X("**/build/"), X("dir with space/build")}},
    {"DoubleStarInfix", {X("proj/**/cache"), X("x/**/bar")}},
    {"TripleStar", {X("lib/***")}},
    {"TripleStarQuirks", {X("cach***"), X("/proj/x/***")}},
    {"TripleStarInclude", {I("/proj/"), I("/proj/src/***"), X("*")}},
    {"CharClasses", {X("[ab].*"), X("*.[!c]"), X("[[:digit:]]*")}},
    {"ClassNegationCaret", {X("[^.a-p]*"), X("?.c")}},
    {"BracketNames", {X("br[ack]et.c"), X("[[]x*")}},
    {"EscapedBrackets", {X("br\\[ack\\]et.c"), X("with space.txt")}},
    {"SpacesInNames", {X("dir with space/"), X("* one.txt")}},
    {"Dotfiles", {X(".*")}},
    {"IncludeCThenDirs", {I("*.c"), I("*/"), X("*")}},
    {"IncludeCNoDirs", {I("*.c"), X("*")}},
    {"PrefixesInOptions", {X("+ a.c"), X("*.c"), I("- *.h")}},
    {"ClearList", {X("*.c"), X("!"), X("*.h")}},
    {"BangIsAPattern", {X("- !"), X("!x")}},
    {"Backslashes", {X("a\\b"), X("x\\*")}},
    {"WhitespaceLine", {XF(" \n")}},
    {"TopExcluded", {X("proj")}},
    {"NestedSameName", {X("proj/proj/"), X("sub/build")}},
    {"ExcludeFrom",
     {XF("# comment\n"
         "; another\n"
         "\n"
         "+ keep.c\n"
         "- *.c\n"
         "*.o\n"
         "c.txt \n"  // trailing space: does not match c.txt
         "+ src/\n"
         "build/\r\n"
         ".git\n")}},
    {"IncludeFrom",
     {IF("# plain lines include here\n"
         "/proj/\n"
         "/proj/docs/***\n"
         "*.md\n"
         "- *.txt\n"
         "*/\n"
         "- *\n")}},
    {"MixedFilesAndOptions",
     {X("*.h"), XF("+ *.o\n- build/sub/\n"), IF("*.c\n"), X("*.txt")}},
    {"ClassCorners", {X("[]x[]*"), X("[!-a-z.]*"), X("[[:upper:]]*")}},
    {"EscapedDoubleStar", {X("x\\**"), X("[!s]\\\\**")}},
    {"DoubleStarInside", {X("s*c/**/*.o"), X("d**.html"), X("l?b/**")}},
};

// The tree both rsync and our walk see: dirs, files, dotfiles, names with
// spaces, brackets and wildcards, and dirs of the same name at several depths.
const char* const kTree[] = {"a.c",
                             "b.h",
                             "c.txt",
                             "keep.c",
                             "1.c",
                             "Makefile",
                             ".hidden",
                             ".git/config",
                             ".git/objects/ab/cdef",
                             "with space.txt",
                             "br[ack]et.c",
                             "brcet.c",
                             "[x]/file",
                             "build/out.o",
                             "build/log.txt",
                             "build/sub/build/deep.o",
                             "src/main.c",
                             "src/util.h",
                             "src/build/x.o",
                             "src/lib/x.c",
                             "src/lib/cache/c1",
                             "src/lib/build",
                             "src/src/inner.c",
                             "src/src/build/y.o",
                             "cache/c0",
                             "docs/readme.md",
                             "docs/a.c",
                             "docs/build/index.html",
                             "dir with space/file one.txt",
                             "dir with space/build/y.o",
                             "foo/bar",
                             "x/foo/bar",
                             "x/y/foo/bar/z.c",
                             "xfoo/bar",
                             "proj/a.c",
                             "proj/proj/b.c",
                             "proj/build/z.o",
                             "lib/readme",
                             "lib/sub/lib/x.c",
                             "tmp/",
                             "!",
                             "!x",
                             " ",
                             "a\\b",
                             "x*"};

class CpFilterOracle : public testing::TestWithParam<RuleSet> {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir;
    const fs::path top = fs::path(tmp_->path()) / "proj";
    for (std::string_view rel : kTree) {
      const fs::path p = top / rel;
      fs::create_directories(rel.ends_with('/') ? p : p.parent_path());
      if (!rel.ends_with('/')) write_file(p, "x");
    }
    fs::create_directories(fs::path(tmp_->path()) / "dst");
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  static TempDir* tmp_;
};
TempDir* CpFilterOracle::tmp_ = nullptr;

// Runs argv (PATH search) and returns its stdout in *out; false with *err on
// a failure to start, a non-zero exit or 30 s gone (then it is killed).
bool run(const std::vector<std::string>& argv, const std::string& err_file,
         std::string* out, std::string* err) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return *err = "pipe failed", false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return *err = "cannot start " + argv[0], false;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd pfd{fds[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      out->append(buf, n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream ef(err_file);
  const std::string stderr_text((std::istreambuf_iterator<char>(ef)), {});
  if (timed_out) return *err = argv[0] + " timed out", false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return *err = argv[0] + " failed (status " + std::to_string(status) +
                  "): " + stderr_text,
           false;
  }
  return true;
}

// What the sender's walk would send: pre-order, an excluded directory not
// descended into.
void walk(const FilterRules& rules, const fs::path& dir, const std::string& wire,
          std::vector<std::string>* sent) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const bool is_dir = e.is_directory(ec);
    const std::string path = wire + "/" + e.path().filename().string();
    if (rules.excluded(path, is_dir)) continue;
    sent->push_back(path);
    if (is_dir) walk(rules, e.path(), path, sent);
  }
}

TEST_P(CpFilterOracle, SameListAsRsync) {
  const RuleSet& set = GetParam();
  std::string out, err;
  if (!run({"rsync", "--version"}, tmp_->path() + "/err", &out, &err)) {
    GTEST_SKIP() << "no rsync to compare with: " << err;
  }
  std::vector<std::string> argv = {"rsync", "-rn", "--out-format=%n"};
  FilterRules rules;
  int files = 0;
  for (const Arg& a : set.args) {
    switch (a.kind) {
      case Arg::kExclude:
        argv.push_back("--exclude=" + a.text);
        ASSERT_EQ(rules.add_exclude(a.text), "");
        break;
      case Arg::kInclude:
        argv.push_back("--include=" + a.text);
        ASSERT_EQ(rules.add_include(a.text), "");
        break;
      case Arg::kExcludeFrom:
      case Arg::kIncludeFrom: {
        const bool inc = a.kind == Arg::kIncludeFrom;
        const std::string file = tmp_->path() + "/rules" + std::to_string(files++);
        write_file(file, a.text);
        argv.push_back((inc ? "--include-from=" : "--exclude-from=") + file);
        ASSERT_EQ(rules.add_from_file(file, inc), "");
        break;
      }
    }
  }
  argv.push_back(tmp_->path() + "/proj");
  argv.push_back(tmp_->path() + "/dst/");
  out.clear();
  ASSERT_TRUE(run(argv, tmp_->path() + "/err", &out, &err)) << err;
  std::set<std::string> want;
  for (size_t at = 0; at < out.size();) {
    size_t nl = out.find('\n', at);
    if (nl == std::string::npos) nl = out.size();
    std::string name = out.substr(at, nl - at);
    at = nl + 1;
    if (name.ends_with('/')) name.pop_back();
    if (!name.empty()) want.insert(name);
  }

  std::vector<std::string> sent;
  if (!rules.excluded("proj", true)) {
    sent.push_back("proj");
    walk(rules, fs::path(tmp_->path()) / "proj", "proj", &sent);
  }
  const std::set<std::string> got(sent.begin(), sent.end());
  EXPECT_EQ(got.size(), sent.size()) << "a path sent twice";
  std::string diff;
  for (const auto& p : want) {
    if (!got.count(p)) diff += "  only rsync sends: " + p + "\n";
  }
  for (const auto& p : got) {
    if (!want.count(p)) diff += "  only we send:    " + p + "\n";
  }
  EXPECT_TRUE(diff.empty()) << set.name << ":\n" << diff;
  // Encoded and decoded (the peer's copy), the rules decide the same for
  // every path of the tree, as a file and as a directory.
  FilterRules peer;
  ASSERT_TRUE(FilterRules::decode(rules.encode(), &peer, &err)) << err;
  std::vector<std::string> all = {"proj"};
  walk(FilterRules(), fs::path(tmp_->path()) / "proj", "proj", &all);
  for (const auto& p : all) {
    for (bool dir : {false, true})
      EXPECT_EQ(peer.verdict(p, dir), rules.verdict(p, dir)) << p;
  }
}

INSTANTIATE_TEST_SUITE_P(CpFilterRsync, CpFilterOracle, testing::ValuesIn(kRuleSets),
                         [](const testing::TestParamInfo<RuleSet>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace rdmakit::cp
