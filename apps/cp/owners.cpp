// Ownership (names, mapping, what may be chowned) and hard links
// (metadata.hpp).
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "metadata.hpp"

namespace rdmakit::cp {
namespace {

// One NSS lookup (getpw*_r / getgr*_r), growing the buffer on ERANGE.
template <typename Rec, typename Key>
bool nss(int (*fn)(Key, Rec*, char*, size_t, Rec**), Key key, Rec* rec,
         std::vector<char>* buf) {
  buf->resize(1024);
  for (;;) {
    Rec* res = nullptr;
    const int rc = fn(key, rec, buf->data(), buf->size(), &res);
    if (rc == ERANGE && buf->size() < (1u << 20)) {
      buf->resize(buf->size() * 2);
      continue;
    }
    return rc == 0 && res != nullptr;
  }
}

// Names by id for the whole process: a tree has few owners, and NSS may be
// slow (LDAP) or unavailable later.
struct NameCache {
  std::mutex mu;
  std::unordered_map<uint32_t, std::string> users, groups;
};
NameCache& name_cache() {
  static NameCache c;
  return c;
}

// The name of an id, looked up once (lookup: getpwuid_r or getgrgid_r; ""
// when there is none).
template <typename Rec, typename Id>
std::string cached_name(std::unordered_map<uint32_t, std::string>& names, uint32_t id,
                        int (*lookup)(Id, Rec*, char*, size_t, Rec**),
                        char* Rec::*name_field) {
  std::lock_guard lock(name_cache().mu);
  if (auto it = names.find(id); it != names.end()) return it->second;
  Rec rec{};
  std::vector<char> buf;
  std::string name;
  if (nss(lookup, static_cast<Id>(id), &rec, &buf)) name = rec.*name_field;
  return names[id] = name;
}

std::string user_name(uint32_t uid) {
  return cached_name(name_cache().users, uid, ::getpwuid_r, &passwd::pw_name);
}

std::string group_name(uint32_t gid) {
  return cached_name(name_cache().groups, gid, ::getgrgid_r, &group::gr_name);
}

// A peer chooses the names: the cache may not grow without end.
constexpr size_t kMaxCachedNames = 4096;

bool sendable_name(const std::string& n) {
  return n.size() <= 255 && n.find('\0') == std::string::npos;
}

// The local id of a peer's user or group name (lookup: getpwnam_r or
// getgrnam_r), cached in ids under mu; the peer's own id for root, an
// unknown or unsendable name, or numeric ids.
template <typename Rec, typename Id>
uint32_t local_id(bool numeric, std::mutex& mu,
                  std::unordered_map<std::string, int64_t>& ids, const std::string& name,
                  uint32_t id, int (*lookup)(const char*, Rec*, char*, size_t, Rec**),
                  Id Rec::*id_field) {
  // A NUL would cut the name short: another user.
  if (numeric || id == 0 || name.empty() || !sendable_name(name)) return id;
  std::lock_guard lock(mu);
  if (ids.size() >= kMaxCachedNames) ids.clear();
  auto [it, fresh] = ids.try_emplace(name, -1);
  if (fresh) {
    Rec rec{};
    std::vector<char> buf;
    if (nss(lookup, name.c_str(), &rec, &buf)) it->second = rec.*id_field;
  }
  return it->second >= 0 ? static_cast<uint32_t>(it->second) : id;
}

bool in_group(uint32_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  for (int i = 0; i < got; ++i)
    if (groups[static_cast<size_t>(i)] == gid) return true;
  return false;
}

bool one_component(const char* n) {
  return n != nullptr && *n != '\0' && std::strchr(n, '/') == nullptr &&
         std::strcmp(n, ".") != 0 && std::strcmp(n, "..") != 0;
}

}  // namespace

bool have_capability(int cap) {
  __user_cap_header_struct head{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (::syscall(SYS_capget, &head, data) != 0) return ::geteuid() == 0;
  return (data[CAP_TO_INDEX(cap)].effective & CAP_TO_MASK(cap)) != 0;
}

Owner owner_of(const struct stat& st, bool numeric_ids) {
  Owner o;
  o.uid = st.st_uid;
  o.gid = st.st_gid;
  if (!numeric_ids) {
    o.user = user_name(o.uid);
    o.group = group_name(o.gid);
  }
  return o;
}

uint32_t IdMapper::uid(const Owner& o) {
  return local_id(numeric_, mu_, users_, o.user, o.uid, ::getpwnam_r, &passwd::pw_uid);
}

uint32_t IdMapper::gid(const Owner& o) {
  return local_id(numeric_, mu_, groups_, o.group, o.gid, ::getgrnam_r, &group::gr_gid);
}

ChownPlan plan_chown(bool preserve_owner, bool preserve_group, uint32_t uid,
                     uint32_t gid) {
  return plan_chown(preserve_owner, preserve_group, uid, gid, have_capability(CAP_CHOWN));
}

ChownPlan plan_chown(bool preserve_owner, bool preserve_group, uint32_t uid, uint32_t gid,
                     bool can_chown) {
  ChownPlan p;
  // The kernel's rule, not the uid: root without CAP_CHOWN (a container)
  // cannot give files away either.
  if (can_chown) {
    if (preserve_owner) p.uid = uid;
    if (preserve_group) p.gid = gid;
    return p;
  }
  if (preserve_group && in_group(gid)) p.gid = gid;
  return p;
}

void encode_owner(const Owner& in, std::vector<std::byte>* out) {
  using namespace metadata_wire;
  put_u32(out, in.uid);
  put_u32(out, in.gid);
  put_str(out, sendable_name(in.user) ? in.user : "");
  put_str(out, sendable_name(in.group) ? in.group : "");
}

bool decode_owner(std::span<const std::byte> in, size_t* consumed, Owner* out,
                  std::string* why) {
  auto refuse = [&](std::string s) {
    *why = std::move(s);
    return false;
  };
  metadata_wire::Cursor c(in);
  Owner o;
  uint32_t len = 0;
  if (!c.u32(&o.uid) || !c.u32(&o.gid)) return refuse("truncated owner");
  for (std::string* name : {&o.user, &o.group}) {
    if (!c.u32(&len)) return refuse("truncated owner");
    if (len > 255) return refuse("owner name of " + std::to_string(len) + " bytes");
    if (!c.bytes(len, name)) return refuse("truncated owner");
    // A NUL would cut the name short in the lookup: another user.
    if (!sendable_name(*name)) return refuse("owner name with a NUL");
  }
  *out = std::move(o);
  *consumed = c.pos();
  return true;
}

uint32_t HardlinkTracker::first_of(const struct stat& st, uint32_t id) {
  if (!S_ISREG(st.st_mode) || st.st_nlink < 2 || id == 0) return 0;
  auto [it, fresh] = seen_.try_emplace({st.st_dev, st.st_ino}, Seen{id, st.st_nlink - 1});
  if (fresh) return 0;
  const uint32_t first = it->second.id;
  // All links seen: the memory goes back (a big tree of linked files).
  if (--it->second.left == 0) seen_.erase(it);
  return first;
}

std::string make_hardlink(int dirfd_target, const char* target_name, int dirfd_new,
                          const char* new_name) {
  // Only the dirfds are known to be inside the tree.
  if (!one_component(target_name) || !one_component(new_name))
    return "hard link: names must be single path components";
  const std::string target(target_name), name(new_name);
  struct stat t {};
  if (::fstatat(dirfd_target, target_name, &t, AT_SYMLINK_NOFOLLOW) != 0)
    return "link target " + target + ": " + std::strerror(errno);
  if (!S_ISREG(t.st_mode)) return "link target " + target + ": not a regular file";
  struct stat n {};
  if (::fstatat(dirfd_new, new_name, &n, AT_SYMLINK_NOFOLLOW) == 0 &&
      n.st_dev == t.st_dev && n.st_ino == t.st_ino)
    return "";  // already linked (rename would keep the temporary name)
  // pid + counter makes the name unique; EEXIST is a dead process's leftover.
  static std::atomic<uint32_t> counter{0};
  std::string tmp;
  for (int tries = 0;; ++tries) {
    tmp = ".rdmakit-cp-link." + std::to_string(::getpid()) + "." +
          std::to_string(counter.fetch_add(1));
    if (::linkat(dirfd_target, target_name, dirfd_new, tmp.c_str(), 0) == 0) break;
    if (errno != EEXIST || tries == 8)
      return "link " + name + ": " + std::strerror(errno);
  }
  // The target may have been swapped (for a symlink, say) since the check:
  // what was linked decides.
  struct stat l {};
  if (::fstatat(dirfd_new, tmp.c_str(), &l, AT_SYMLINK_NOFOLLOW) != 0 ||
      l.st_dev != t.st_dev || l.st_ino != t.st_ino || !S_ISREG(l.st_mode)) {
    ::unlinkat(dirfd_new, tmp.c_str(), 0);
    return "link target " + target + ": changed while linking";
  }
  if (::renameat(dirfd_new, tmp.c_str(), dirfd_new, new_name) != 0) {
    const int e = errno;
    ::unlinkat(dirfd_new, tmp.c_str(), 0);
    return "link " + name + ": " + std::strerror(e);
  }
  // rename() of two links to one inode succeeds and does nothing (a race
  // with another linker): the temporary name must not stay.
  ::unlinkat(dirfd_new, tmp.c_str(), 0);
  return "";
}

}  // namespace rdmakit::cp
