// File metadata for -X -A -o -g --numeric-ids -H (metadata.hpp), against the
// real thing: attributes set and checked with setfattr/getfattr and
// setfacl/getfacl on /tmp, non-root behaviour in forked children.
#include "metadata.hpp"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace rdmakit::cp {
namespace {

// Exit status and stdout of a shell command.
int run(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) s.append(buf, n);
  const int st = ::pclose(p);
  if (out != nullptr) *out = s;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string q(const std::string& path) { return "'" + path + "'"; }

// Every attribute of path as getfattr dumps it, without the "# file:" line.
std::string getfattr_dump(const std::string& path, bool nofollow = false) {
  std::string out;
  EXPECT_EQ(run("getfattr -d -m - --absolute-names " +
                    std::string(nofollow ? "-h " : "") + q(path),
                &out),
            0);
  const auto nl = out.find('\n');
  return nl == std::string::npos ? out : out.substr(nl + 1);
}

std::string getfacl_dump(const std::string& path) {
  std::string out;
  EXPECT_EQ(run("getfacl --omit-header --absolute-names " + q(path), &out), 0);
  return out;
}

void sh(const std::string& cmd) { ASSERT_EQ(run(cmd + " 2>&1"), 0) << cmd; }

std::vector<std::string> names(const std::vector<Xattr>& v) {
  std::vector<std::string> n;
  for (const auto& x : v) n.push_back(x.name);
  return n;
}

// All attribute names of path (getfattr's view), as one string.
std::string all_names(const std::string& path, bool nofollow = false) {
  std::string out, r;
  run("getfattr -m - --absolute-names " + std::string(nofollow ? "-h " : "") + q(path),
      &out);
  size_t at = 0;
  for (size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = out.substr(at, nl - at);
    if (!line.empty() && line[0] != '#') r += (r.empty() ? "" : " ") + line;
  }
  return r;
}

uint32_t uid_of(const char* user) {
  const passwd* pw = ::getpwnam(user);
  return pw != nullptr ? pw->pw_uid : 0xffffffffu;
}
uint32_t gid_of(const char* grp) {
  const group* gr = ::getgrnam(grp);
  return gr != nullptr ? gr->gr_gid : 0xffffffffu;
}

// Runs fn in a forked child as nobody:nogroup with the given supplementary
// groups; returns what fn returned (nothing to restore in this process).
std::string as_nobody(std::vector<gid_t> groups, const std::function<std::string()>& fn) {
  int p[2];
  if (::pipe(p) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string out = "setup failed";
    const gid_t g = gid_of("nogroup");
    const uid_t u = uid_of("nobody");
    if (::setgroups(groups.size(), groups.data()) == 0 && ::setresgid(g, g, g) == 0 &&
        ::setresuid(u, u, u) == 0)
      out = fn();
    const bool ok =
        ::write(p[1], out.data(), out.size()) == static_cast<ssize_t>(out.size());
    ::_exit(ok ? 0 : 1);
  }
  ::close(p[1]);
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;)
    s.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return s;
}

// A fresh 0755 directory under /tmp (ext4: user xattrs and ACLs), removed
// afterwards.
class CpMetaFs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cpmeta.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    dfd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dfd_, 0);
  }
  void TearDown() override {
    if (dfd_ >= 0) ::close(dfd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  int open_at(const std::string& name, int flags = O_RDONLY) {
    const int fd = ::openat(dfd_, name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
    EXPECT_GE(fd, 0) << name;
    fds_.push_back(fd);
    return fd;
  }
  void touch(const std::string& name, const std::string& content = "") {
    const int fd =
        ::openat(dfd_, name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, content.data(), content.size()),
              static_cast<ssize_t>(content.size()));
    ::close(fd);
  }
  ~CpMetaFs() override {
    for (int fd : fds_) ::close(fd);
  }

  std::string dir_;
  int dfd_ = -1;
  std::vector<int> fds_;
};

using CpMetaXattr = CpMetaFs;
using CpMetaLink = CpMetaFs;

constexpr XattrSelect kBoth{true, true};

TEST_F(CpMetaXattr, FileRoundTripMatchesGetfattrAndGetfacl) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  touch("src", "data");
  sh("setfattr -n user.a -v 1 " + q(path("src")));
  sh("setfattr -n user.bin -v 0x00ff0a00 " + q(path("src")));
  sh("setfattr -n trusted.t -v x " + q(path("src")));  // root: trusted.* is copied
  sh("setfacl -m u:nobody:r,g:daemon:rw " + q(path("src")));
  std::vector<Xattr> got;
  ASSERT_EQ(read_xattrs(open_at("src"), -1, nullptr, kBoth, &got), "");
  EXPECT_EQ(names(got), (std::vector<std::string>{"system.posix_acl_access", "trusted.t",
                                                  "user.a", "user.bin"}));
  EXPECT_EQ(got[3].value, std::string("\0\xff\n\0", 4));

  std::vector<std::byte> wire;
  encode_xattrs(got, &wire);
  std::vector<Xattr> back;
  size_t used = 0;
  std::string why;
  ASSERT_TRUE(decode_xattrs(wire, &used, &back, &why)) << why;
  EXPECT_EQ(used, wire.size());
  EXPECT_EQ(back, got);

  touch("dst");
  const int dst = open_at("dst");  // attributes need no write access to the fd
  ASSERT_EQ(apply_xattrs(dst, -1, nullptr, kBoth, back), "");
  EXPECT_EQ(getfattr_dump(path("dst")), getfattr_dump(path("src")));
  EXPECT_EQ(getfacl_dump(path("dst")), getfacl_dump(path("src")));
  EXPECT_NE(getfacl_dump(path("dst")).find("user:nobody:r--"), std::string::npos);

  // Already equal: nothing is written (the ctime stays).
  struct stat before {
  }, after{};
  ASSERT_EQ(::fstat(dst, &before), 0);
  ASSERT_EQ(apply_xattrs(dst, -1, nullptr, kBoth, back), "");
  ASSERT_EQ(::fstat(dst, &after), 0);
  EXPECT_EQ(before.st_ctim.tv_nsec, after.st_ctim.tv_nsec);
  EXPECT_EQ(before.st_ctim.tv_sec, after.st_ctim.tv_sec);
}

TEST_F(CpMetaXattr, DirectoryAccessAndDefaultAcls) {
  ASSERT_EQ(::mkdirat(dfd_, "src", 0755), 0);
  ASSERT_EQ(::mkdirat(dfd_, "dst", 0755), 0);
  sh("setfacl -m u:nobody:rx " + q(path("src")));
  sh("setfacl -d -m u:daemon:rwx,g:nogroup:r " + q(path("src")));
  sh("setfattr -n user.d -v dir " + q(path("src")));
  std::vector<Xattr> got;
  ASSERT_EQ(read_xattrs(open_at("src", O_RDONLY | O_DIRECTORY), -1, nullptr, kBoth, &got),
            "");
  EXPECT_EQ(names(got), (std::vector<std::string>{"system.posix_acl_access",
                                                  "system.posix_acl_default", "user.d"}));
  // By directory fd and name this time (the receiver's way).
  ASSERT_EQ(apply_xattrs(-1, dfd_, "dst", kBoth, got), "");
  EXPECT_EQ(getfattr_dump(path("dst")), getfattr_dump(path("src")));
  const std::string acl = getfacl_dump(path("dst"));
  EXPECT_EQ(acl, getfacl_dump(path("src")));
  EXPECT_NE(acl.find("default:user:daemon:rwx"), std::string::npos) << acl;
  EXPECT_NE(acl.find("user:nobody:r-x"), std::string::npos) << acl;

  // -A only: the user.* attribute is neither read nor touched.
  ASSERT_EQ(read_xattrs(-1, dfd_, "dst", {false, true}, &got), "");
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(apply_xattrs(-1, dfd_, "dst", {false, true}, {}), "");
  EXPECT_EQ(all_names(path("dst")), "user.d");
}

TEST_F(CpMetaXattr, SymlinkIsNotFollowedAndRefusesUserAttributes) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  touch("target");
  sh("setfattr -n user.f -v target " + q(path("target")));
  ASSERT_EQ(::symlinkat("target", dfd_, "ls"), 0);
  ASSERT_EQ(::symlinkat("target", dfd_, "ld"), 0);
  sh("setfattr -h -n trusted.t -v link " + q(path("ls")));
  std::vector<Xattr> got;
  ASSERT_EQ(read_xattrs(-1, dfd_, "ls", kBoth, &got), "");
  ASSERT_EQ(names(got), std::vector<std::string>{"trusted.t"});  // not target's user.f
  // And by an O_PATH | O_NOFOLLOW fd of the link itself.
  std::vector<Xattr> by_fd;
  ASSERT_EQ(read_xattrs(open_at("ls", O_PATH), -1, nullptr, kBoth, &by_fd), "");
  EXPECT_EQ(by_fd, got);
  ASSERT_EQ(apply_xattrs(-1, dfd_, "ld", kBoth, got), "");
  EXPECT_EQ(getfattr_dump(path("ld"), true), getfattr_dump(path("ls"), true));
  EXPECT_EQ(all_names(path("target")), "user.f");

  // Linux keeps user.* off symlinks, and ACLs too: reported, by name.
  got.push_back({"user.u", "1"});
  got.push_back({"system.posix_acl_access", std::string(4, '\0')});
  const std::string err = apply_xattrs(-1, dfd_, "ld", kBoth, got);
  EXPECT_NE(err.find("set user.u: "), std::string::npos) << err;
  EXPECT_NE(err.find("set system.posix_acl_access: "), std::string::npos) << err;
  EXPECT_EQ(all_names(path("ld"), true), "trusted.t");

  // A path, not a component, is refused: only dirfd is inside the tree.
  EXPECT_NE(read_xattrs(-1, dfd_, "sub/ls", kBoth, &got), "");
}

TEST_F(CpMetaXattr, OpathFdIsRead) {
  touch("f");
  sh("setfattr -n user.a -v 1 " + q(path("f")));
  std::vector<Xattr> got;
  ASSERT_EQ(read_xattrs(open_at("f", O_PATH), -1, nullptr, {true, false}, &got), "");
  EXPECT_EQ(got, (std::vector<Xattr>{{"user.a", "1"}}));
}

TEST_F(CpMetaXattr, ApplyRemovesExtrasInSelectedNamespacesOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  touch("f");
  const std::string f = q(path("f"));
  sh("setfattr -n user.old -v o " + f + " && setfattr -n user.keep -v v " + f);
  sh("setfattr -n trusted.t -v t " + f + " && setfacl -m u:nobody:r " + f);
  const int fd = open_at("f");
  // -X as root: user.*, trusted.* (and security.*) follow `want`; the ACL stays.
  ASSERT_EQ(apply_xattrs(fd, -1, nullptr, {true, false},
                         {{"user.new", "n"}, {"user.keep", "v2"}}),
            "");
  EXPECT_EQ(all_names(path("f")), "system.posix_acl_access user.keep user.new");
  std::vector<Xattr> got;
  ASSERT_EQ(read_xattrs(fd, -1, nullptr, {true, false}, &got), "");
  EXPECT_EQ(got, (std::vector<Xattr>{{"user.keep", "v2"}, {"user.new", "n"}}));
  // -A: the ACL goes, the user.* attributes stay.
  ASSERT_EQ(apply_xattrs(fd, -1, nullptr, {false, true}, {}), "");
  EXPECT_EQ(all_names(path("f")), "user.keep user.new");
  // Nothing selected: nothing touched.
  ASSERT_EQ(apply_xattrs(fd, -1, nullptr, {}, {}), "");
  EXPECT_EQ(all_names(path("f")), "user.keep user.new");
  // Names outside the selection, or outside every copied namespace, or cut
  // short by a NUL, are refused by name; the rest is still applied.
  const std::string err = apply_xattrs(
      fd, -1, nullptr, {false, true},
      {{"user.keep", "x"}, {"system.foo", "y"}, {std::string("user.a\0b", 8), "z"}});
  EXPECT_NE(err.find("user.keep: not selected"), std::string::npos) << err;
  EXPECT_NE(err.find("system.foo"), std::string::npos) << err;
  EXPECT_NE(err.find("NUL"), std::string::npos) << err;
  EXPECT_EQ(all_names(path("f")), "user.keep user.new");
}

TEST_F(CpMetaXattr, NonRootReadsAndWritesUserNamespaceOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  touch("f");
  const std::string f = q(path("f"));
  sh("setfattr -n user.a -v 1 " + f + " && setfattr -n trusted.t -v t " + f);
  sh("chown nobody:nogroup " + f);
  const std::string p = path("f");
  const std::string r = as_nobody({}, [&] {
    std::vector<Xattr> got;
    std::string s = read_xattrs(-1, AT_FDCWD, p.c_str(), kBoth, &got);
    for (const auto& x : got) s += "[" + x.name + "]";
    // trusted.t is not this process's to remove: it stays.
    s += "|" + apply_xattrs(-1, AT_FDCWD, p.c_str(), kBoth, {{"user.b", "2"}});
    s += "|" + apply_xattrs(-1, AT_FDCWD, p.c_str(), kBoth,
                            {{"user.b", "2"}, {"trusted.x", "3"}});
    return s;
  });
  EXPECT_EQ(
      r.rfind("[user.a]||set trusted.x: Operation not permitted (needs CAP_SYS_ADMIN", 0),
      0u)
      << r;
  EXPECT_EQ(all_names(path("f")), "trusted.t user.b");
}

TEST(CpMetaWire, XattrsRoundTripWithTrailingBytes) {
  const std::vector<Xattr> in = {{"user.z", std::string(kMaxXattrValue, 'v')},
                                 {"security.capability", std::string("\0\1", 2)},
                                 {"trusted.empty", ""},
                                 {"system.posix_acl_default", "acl"},
                                 {"user." + std::string(250, 'n'), "x"}};
  std::vector<std::byte> wire;
  encode_xattrs(in, &wire);
  const size_t size = wire.size();
  wire.push_back(std::byte{42});
  std::vector<Xattr> out;
  size_t used = 0;
  std::string why;
  ASSERT_TRUE(decode_xattrs(wire, &used, &out, &why)) << why;
  EXPECT_EQ(used, size);
  auto sorted = in;
  std::sort(sorted.begin(), sorted.end(),
            [](const Xattr& a, const Xattr& b) { return a.name < b.name; });
  EXPECT_EQ(out, sorted);
  // The empty list.
  wire.clear();
  encode_xattrs({}, &wire);
  ASSERT_TRUE(decode_xattrs(wire, &used, &out, &why));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(used, 4u);
}

bool decodes(const std::vector<Xattr>& in, std::string* why) {
  std::vector<std::byte> wire;
  encode_xattrs(in, &wire);
  std::vector<Xattr> out;
  size_t used = 0;
  return decode_xattrs(wire, &used, &out, why);
}

TEST(CpMetaWire, EveryTruncationIsRefused) {
  std::vector<std::byte> wire;
  encode_xattrs({{"user.a", "12345"}, {"trusted.b", ""}}, &wire);
  for (size_t n = 0; n < wire.size(); ++n) {
    std::vector<Xattr> out;
    size_t used = 0;
    std::string why;
    EXPECT_FALSE(decode_xattrs(std::span(wire).first(n), &used, &out, &why)) << n;
    EXPECT_NE(why, "");
    EXPECT_TRUE(out.empty());
  }
}

TEST(CpMetaWire, OversizedListsAreRefused) {
  std::string why;
  std::vector<Xattr> many;
  for (int i = 0; i < 1024; ++i) many.push_back({"user." + std::to_string(i), "v"});
  EXPECT_TRUE(decodes(many, &why)) << why;
  many.push_back({"user.one-more", "v"});
  EXPECT_FALSE(decodes(many, &why));
  EXPECT_NE(why.find("1025 attributes"), std::string::npos) << why;

  EXPECT_TRUE(decodes({{"user." + std::string(250, 'n'), ""}}, &why)) << why;
  EXPECT_FALSE(decodes({{"user." + std::string(251, 'n'), ""}}, &why));
  EXPECT_FALSE(decodes({{"user.a", std::string(kMaxXattrValue + 1, 'v')}}, &why));

  std::vector<Xattr> big;
  for (int i = 0; i < 15; ++i)
    big.push_back({"user." + std::to_string(i), std::string(kMaxXattrValue, 'v')});
  EXPECT_TRUE(decodes(big, &why)) << why;
  big.push_back({"user.16", std::string(kMaxXattrValue, 'v')});
  EXPECT_FALSE(decodes(big, &why));
  EXPECT_NE(why.find("1 MiB"), std::string::npos) << why;

  // A count of 4 billion with nothing behind it: refused before any work.
  const std::vector<std::byte> huge = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff},
                                       std::byte{0xff}};
  std::vector<Xattr> out;
  size_t used = 0;
  EXPECT_FALSE(decode_xattrs(huge, &used, &out, &why));
}

TEST(CpMetaWire, NamesOutsideTheNamespacesAreRefused) {
  std::string why;
  for (const std::string bad :
       {"", "foo", "user.", "trusted.", "security.", "User.x", "system.foo",
        "system.posix_acl_access.x", "system.posix_acl"}) {
    EXPECT_FALSE(decodes({{bad, "v"}}, &why)) << bad;
  }
  EXPECT_FALSE(decodes({{std::string("user.a\0b", 8), "v"}}, &why));
  EXPECT_NE(why.find("NUL"), std::string::npos) << why;
  EXPECT_FALSE(decodes({{"user.a", "1"}, {"user.a", "2"}}, &why));
  EXPECT_NE(why.find("twice"), std::string::npos) << why;
  for (const std::string good : {"user.a", "trusted.a", "security.capability",
                                 "system.posix_acl_access", "system.posix_acl_default"})
    EXPECT_TRUE(decodes({{good, "v"}}, &why)) << good << ": " << why;
}

TEST_F(CpMetaFs, OwnerOfNamesTheIds) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  touch("f");
  struct stat st {};
  ASSERT_EQ(::fchownat(dfd_, "f", uid_of("daemon"), gid_of("daemon"), 0), 0);
  ASSERT_EQ(::fstatat(dfd_, "f", &st, 0), 0);
  EXPECT_EQ(owner_of(st, false),
            (Owner{uid_of("daemon"), gid_of("daemon"), "daemon", "daemon"}));
  EXPECT_EQ(owner_of(st, true), (Owner{uid_of("daemon"), gid_of("daemon"), "", ""}));
  if (::getpwuid(4242) == nullptr && ::getgrgid(4242) == nullptr) {
    ASSERT_EQ(::fchownat(dfd_, "f", 4242, 4242, 0), 0);
    ASSERT_EQ(::fstatat(dfd_, "f", &st, 0), 0);
    EXPECT_EQ(owner_of(st, false), (Owner{4242, 4242, "", ""}));
  }
  st.st_uid = 0;
  st.st_gid = 0;
  EXPECT_EQ(owner_of(st, false), (Owner{0, 0, "root", "root"}));
}

TEST(CpMetaOwner, IdMapperByNameUnlessNumeric) {
  const uint32_t daemon_uid = uid_of("daemon"), daemon_gid = gid_of("daemon");
  const uint32_t nobody = uid_of("nobody"), nogroup = gid_of("nogroup");
  ASSERT_NE(daemon_uid, 0xffffffffu);
  ASSERT_NE(nogroup, 0xffffffffu);
  IdMapper by_name(false), numeric(true);
  const Owner daemon{4242, 4343, "daemon", "daemon"};
  EXPECT_EQ(by_name.uid(daemon), daemon_uid);
  EXPECT_EQ(by_name.gid(daemon), daemon_gid);
  EXPECT_EQ(by_name.uid(daemon), daemon_uid);  // cached, same answer
  EXPECT_EQ(numeric.uid(daemon), 4242u);
  EXPECT_EQ(numeric.gid(daemon), 4343u);
  const Owner other{4242, 4343, "nobody", "nogroup"};
  EXPECT_EQ(by_name.uid(other), nobody);
  EXPECT_EQ(by_name.gid(other), nogroup);
  // No such name here, or none sent: the number.
  const Owner unknown{4242, 4343, "no-such-user-cpmeta", "no-such-group-cpmeta"};
  EXPECT_EQ(by_name.uid(unknown), 4242u);
  EXPECT_EQ(by_name.gid(unknown), 4343u);
  EXPECT_EQ(by_name.uid(Owner{4242, 4343, "", ""}), 4242u);
  // rsync: a peer's root stays root whatever its name; a name maps to root.
  EXPECT_EQ(by_name.uid(Owner{0, 0, "nobody", "nogroup"}), 0u);
  EXPECT_EQ(by_name.gid(Owner{0, 0, "nobody", "nogroup"}), 0u);
  EXPECT_EQ(by_name.uid(Owner{7, 7, "root", "root"}), 0u);
  // A NUL would look up "root": the number instead.
  EXPECT_EQ(by_name.uid(Owner{7, 7, std::string("root\0x", 6), ""}), 7u);
}

TEST(CpMetaOwner, WireRoundTripAndBounds) {
  const Owner o{1000, 2000, "alice", std::string(255, 'g')};
  std::vector<std::byte> wire;
  encode_owner(o, &wire);
  const size_t size = wire.size();
  wire.push_back(std::byte{1});
  Owner back;
  size_t used = 0;
  std::string why;
  ASSERT_TRUE(decode_owner(wire, &used, &back, &why)) << why;
  EXPECT_EQ(back, o);
  EXPECT_EQ(used, size);
  for (size_t n = 0; n < size; ++n)
    EXPECT_FALSE(decode_owner(std::span(wire).first(n), &used, &back, &why)) << n;
  // Names that may not go are sent empty (the number is used).
  wire.clear();
  encode_owner({1, 2, std::string(256, 'u'), std::string("a\0b", 3)}, &wire);
  ASSERT_TRUE(decode_owner(wire, &used, &back, &why)) << why;
  EXPECT_EQ(back, (Owner{1, 2, "", ""}));
  // What the encoder would not write is refused.
  auto raw = [](uint32_t ulen, const std::string& user) {
    std::vector<std::byte> w;
    metadata_wire::put_u32(&w, 1);
    metadata_wire::put_u32(&w, 2);
    metadata_wire::put_u32(&w, ulen);
    for (char c : user) w.push_back(static_cast<std::byte>(c));
    metadata_wire::put_str(&w, "");
    return w;
  };
  EXPECT_FALSE(decode_owner(raw(256, std::string(256, 'u')), &used, &back, &why));
  EXPECT_NE(why.find("256 bytes"), std::string::npos) << why;
  EXPECT_FALSE(decode_owner(raw(3, std::string("a\0b", 3)), &used, &back, &why));
  EXPECT_NE(why.find("NUL"), std::string::npos) << why;
  EXPECT_TRUE(decode_owner(raw(3, "abc"), &used, &back, &why)) << why;
}

TEST(CpMetaOwner, PlanChownAsRoot) {
  if (!have_capability(CAP_CHOWN)) GTEST_SKIP() << "needs CAP_CHOWN";
  EXPECT_EQ(plan_chown(true, true, 5, 6), (ChownPlan{5, 6}));
  EXPECT_EQ(plan_chown(false, true, 5, 6), (ChownPlan{-1, 6}));
  EXPECT_EQ(plan_chown(true, false, 5, 6), (ChownPlan{5, -1}));
  EXPECT_EQ(plan_chown(false, false, 5, 6), (ChownPlan{-1, -1}));
}

TEST_F(CpMetaFs, PlanChownAsNonRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (trusted.*, chown, setresuid)";
  const gid_t daemon = gid_of("daemon"), nogroup = gid_of("nogroup");
  touch("f");
  ASSERT_EQ(::fchownat(dfd_, "f", uid_of("nobody"), nogroup, 0), 0);
  const std::string p = path("f");
  const std::string r = as_nobody({daemon}, [&] {
    auto str = [](ChownPlan c) {
      return std::to_string(c.uid) + ":" + std::to_string(c.gid) + " ";
    };
    std::string s = str(plan_chown(true, true, 0, nogroup));  // its own group
    s += str(plan_chown(true, true, 0, daemon));              // a supplementary one
    s += str(plan_chown(true, true, 0, 0));                   // not its group
    s += str(plan_chown(true, false, 0, nogroup));            // no -g
    const ChownPlan c = plan_chown(true, true, 0, daemon);
    s += ::fchownat(AT_FDCWD, p.c_str(), static_cast<uid_t>(c.uid),
                    static_cast<gid_t>(c.gid), AT_SYMLINK_NOFOLLOW) == 0
             ? "chown ok"
             : std::string("chown: ") + std::strerror(errno);
    return s;
  });
  const std::string ng = std::to_string(nogroup), dm = std::to_string(daemon);
  EXPECT_EQ(r, "-1:" + ng + " -1:" + dm + " -1:-1 -1:-1 chown ok");
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, uid_of("nobody"));
  EXPECT_EQ(st.st_gid, daemon);
}

struct stat fake(mode_t type, nlink_t links, dev_t dev, ino_t ino) {
  struct stat st {};
  st.st_mode = type | 0644;
  st.st_nlink = links;
  st.st_dev = dev;
  st.st_ino = ino;
  return st;
}

TEST(CpMetaHardlink, TrackerLinksLaterEntriesToTheFirst) {
  HardlinkTracker t;
  EXPECT_EQ(t.first_of(fake(S_IFREG, 1, 1, 5), 1), 0u);  // a single link
  EXPECT_EQ(t.size(), 0u);
  const auto three = fake(S_IFREG, 3, 1, 7);
  EXPECT_EQ(t.first_of(three, 10), 0u);
  EXPECT_EQ(t.first_of(fake(S_IFREG, 2, 2, 7), 11), 0u);  // same ino, other device
  EXPECT_EQ(t.first_of(three, 12), 10u);
  EXPECT_EQ(t.first_of(three, 13), 10u);  // all three seen: forgotten
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.first_of(fake(S_IFREG, 2, 2, 7), 14), 11u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.first_of(fake(S_IFDIR, 5, 1, 9), 15), 0u);  // . and .. count as links
  EXPECT_EQ(t.first_of(fake(S_IFDIR, 5, 1, 9), 16), 0u);
  EXPECT_EQ(t.first_of(fake(S_IFLNK, 2, 1, 10), 17), 0u);
  EXPECT_EQ(t.first_of(fake(S_IFLNK, 2, 1, 10), 18), 0u);
}

TEST_F(CpMetaLink, TrackerOnRealFiles) {
  touch("a");
  ASSERT_EQ(::linkat(dfd_, "a", dfd_, "b", 0), 0);
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstatat(dfd_, "a", &a, AT_SYMLINK_NOFOLLOW), 0);
  ASSERT_EQ(::fstatat(dfd_, "b", &b, AT_SYMLINK_NOFOLLOW), 0);
  HardlinkTracker t;
  EXPECT_EQ(t.first_of(a, 3), 0u);
  EXPECT_EQ(t.first_of(b, 4), 3u);
}

// Names left in the directory that start with the temporary prefix.
int leftovers(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".rdmakit-cp-link", 0) == 0) ++n;
  return n;
}

TEST_F(CpMetaLink, MakeHardlinkReplacesAtomically) {
  touch("a", "AAA");
  touch("b", "other");
  ASSERT_EQ(::mkdirat(dfd_, "sub", 0755), 0);
  const int sub = open_at("sub", O_RDONLY | O_DIRECTORY);
  ASSERT_EQ(make_hardlink(dfd_, "a", dfd_, "b"), "");
  ASSERT_EQ(make_hardlink(dfd_, "a", sub, "c"), "");   // another directory, new name
  ASSERT_EQ(make_hardlink(dfd_, "a", dfd_, "b"), "");  // already so: nothing to do
  struct stat a {
  }, b{}, c{};
  ASSERT_EQ(::fstatat(dfd_, "a", &a, 0), 0);
  ASSERT_EQ(::fstatat(dfd_, "b", &b, 0), 0);
  ASSERT_EQ(::fstatat(sub, "c", &c, 0), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_ino, c.st_ino);
  EXPECT_EQ(a.st_nlink, 3u);
  std::string content;
  ASSERT_EQ(run("cat " + q(path("b")), &content), 0);
  EXPECT_EQ(content, "AAA");
  EXPECT_EQ(leftovers(dir_), 0);
  EXPECT_EQ(leftovers(path("sub")), 0);
}

TEST_F(CpMetaLink, MakeHardlinkRefusesWhatIsNotARegularFile) {
  touch("a");
  touch("b", "keep");
  ASSERT_EQ(::symlinkat("a", dfd_, "sym"), 0);
  ASSERT_EQ(::mkdirat(dfd_, "d", 0755), 0);
  std::string err = make_hardlink(dfd_, "sym", dfd_, "b");  // not followed to "a"
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  err = make_hardlink(dfd_, "d", dfd_, "b");
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  EXPECT_NE(make_hardlink(dfd_, "missing", dfd_, "b"), "");
  // Over a directory: refused by rename, and the temporary name is gone.
  EXPECT_NE(make_hardlink(dfd_, "a", dfd_, "d"), "");
  EXPECT_NE(make_hardlink(dfd_, "a", dfd_, "d/x"), "");  // components only
  EXPECT_NE(make_hardlink(dfd_, "../a", dfd_, "x"), "");
  EXPECT_NE(make_hardlink(dfd_, "a", dfd_, ".."), "");
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstatat(dfd_, "a", &a, AT_SYMLINK_NOFOLLOW), 0);
  ASSERT_EQ(::fstatat(dfd_, "b", &b, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_nlink, 1u);
  EXPECT_EQ(leftovers(dir_), 0);
}

}  // namespace
}  // namespace rdmakit::cp
