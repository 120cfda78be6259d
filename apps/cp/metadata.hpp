#pragma once
// Local file metadata beyond mode and times, for rsync's -X -A -o -g
// --numeric-ids -H: extended attributes and POSIX ACLs (as the kernel stores
// them, the xattrs system.posix_acl_access/default), ownership and its
// mapping by name, and hard links. Only libc and Linux syscalls. Errors are
// returned as text ("" = success); nothing throws on purpose.
// xattrs.cpp: attributes and their wire form; owners.cpp: the rest.
//
// Paths: an object is named either by an open fd, or (fd = -1) by a
// directory fd and one path component, as the receiver holds them
// (confine.hpp). A component never contains '/': only the dirfd is trusted to
// be inside the tree. dirfd = AT_FDCWD takes `name` as a plain path.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rdmakit::cp {

// True if `cap` (linux/capability.h) is in the process's effective set.
bool have_capability(int cap);

// ---- Extended attributes and ACLs (xattrs.cpp) ----

struct Xattr {
  std::string name;
  std::string value;
  bool operator==(const Xattr&) const = default;
};
struct XattrSelect {
  bool xattrs = false;  // -X: user.*; also trusted.* and security.* with CAP_SYS_ADMIN
  bool acls = false;    // -A: system.posix_acl_access, system.posix_acl_default
  // trusted.* and security.* (security.capability grants privileges like a
  // setuid bit): off when the attributes come from a peer not trusted with
  // them (serve and pull without --preserve-special).
  bool privileged = true;
};

// Bounds of the wire form (and of what read_xattrs returns).
inline constexpr size_t kMaxXattrs = 1024;
inline constexpr size_t kMaxXattrName = 255;         // XATTR_NAME_MAX
inline constexpr size_t kMaxXattrValue = 64 * 1024;  // XATTR_SIZE_MAX
inline constexpr size_t kMaxXattrTotal = 1 << 20;    // names + values

// The selected attributes of an open fd, or (fd = -1) of dirfd/name without
// following a symlink, sorted by name. A filesystem without xattr support
// gives an empty list. Returns "" or the reason.
std::string read_xattrs(int fd, int dirfd, const char* name, XattrSelect sel,
                        std::vector<Xattr>* out);

// Makes the target's selected attributes exactly `want`: sets those that
// differ, removes those in the selected namespaces that `want` lacks (never
// security.selinux: the receiver's policy labels its files). A name of
// `want` outside the selection is refused. Goes on after a failure; returns
// "" or every failure, each naming its attribute. An access ACL sets the
// mode's group bits (its mask): set the mode after, as rsync -A does.
std::string apply_xattrs(int fd, int dirfd, const char* name, XattrSelect sel,
                         const std::vector<Xattr>& want);

// Wire form, appended to *out: u32 count, then per attribute u32 name length,
// name, u32 value length, value (little-endian). Writes what it is given;
// the decoder enforces the bounds.
void encode_xattrs(const std::vector<Xattr>& in, std::vector<std::byte>* out);
// Input is hostile: refuses (false, *why) a truncated list, more than
// kMaxXattrs, a name empty, over kMaxXattrName, with a NUL, outside user.*,
// trusted.*, security.* and the two ACL names, or repeated, a value over
// kMaxXattrValue, names and values over kMaxXattrTotal. On success
// *consumed is the bytes used (input may go on) and *out is sorted by name.
bool decode_xattrs(std::span<const std::byte> in, size_t* consumed,
                   std::vector<Xattr>* out, std::string* why);

// ---- Ownership (owners.cpp) ----

struct Owner {
  uint32_t uid = 0, gid = 0;
  std::string user, group;  // empty: no name (or --numeric-ids)
  bool operator==(const Owner&) const = default;
};

// st's owner with its names (getpwuid_r/getgrgid_r, cached for the
// process), or without names if numeric_ids.
Owner owner_of(const struct stat& st, bool numeric_ids);

// A peer's owner as local ids, as rsync maps them: by name when it has one
// that exists here and !numeric_ids, else the peer's number. A peer's id 0
// is never mapped by name (rsync's rule: root stays root). Thread-safe;
// caches names (a bounded number).
class IdMapper {
 public:
  explicit IdMapper(bool numeric_ids) : numeric_(numeric_ids) {}
  uint32_t uid(const Owner& o);
  uint32_t gid(const Owner& o);

 private:
  bool numeric_;
  std::mutex mu_;
  std::unordered_map<std::string, int64_t> users_, groups_;  // -1: no such name
};

// What this process may change, as (uid, gid) for fchownat (-1 = leave).
// With CAP_CHOWN (root): the uid if -o, the gid if -g. Without: never the
// uid (rsync: a non-root receiver keeps its own), the gid only if -g and it
// is the process's group or one of its supplementary groups. A chown clears
// set-id bits: chmod after it.
struct ChownPlan {
  int64_t uid = -1, gid = -1;
  bool operator==(const ChownPlan&) const = default;
};
ChownPlan plan_chown(bool preserve_owner, bool preserve_group, uint32_t uid,
                     uint32_t gid);
// The same with CAP_CHOWN known (a caller deciding for many files asks once).
ChownPlan plan_chown(bool preserve_owner, bool preserve_group, uint32_t uid, uint32_t gid,
                     bool can_chown);

// Wire form, appended: u32 uid, u32 gid, u32 length + user, u32 length +
// group. A name that may not be sent (over 255 bytes, with a NUL) is sent
// empty: the peer then uses the number, as for a user without a name.
void encode_owner(const Owner& in, std::vector<std::byte>* out);
// Refuses a truncated record, a name over 255 bytes or with a NUL.
bool decode_owner(std::span<const std::byte> in, size_t* consumed, Owner* out,
                  std::string* why);

// ---- Hard links, -H (owners.cpp) ----

// Sender side: the first wire id of each regular file with st_nlink > 1,
// by (st_dev, st_ino). An inode is forgotten once all its links were seen.
class HardlinkTracker {
 public:
  // The id of an earlier entry of the same inode (send this one as a link
  // to it), or 0: not a link, or the first of its inode (remembered). Ids
  // are nonzero. Directories, symlinks, devices: always 0.
  uint32_t first_of(const struct stat& st, uint32_t id);
  size_t size() const { return seen_.size(); }

 private:
  struct Seen {
    uint32_t id;
    nlink_t left;  // links not seen yet
  };
  std::map<std::pair<dev_t, ino_t>, Seen> seen_;
};

// Receiver side: makes dirfd_new/new_name a hard link to
// dirfd_target/target_name, replacing what new_name was atomically (link to
// a temporary name in the same directory, then renameat). Refuses a target
// that is not a regular file; never follows a symlink. Names are single
// components. Nothing to do if new_name already is that inode.
std::string make_hardlink(int dirfd_target, const char* target_name, int dirfd_new,
                          const char* new_name);

// The little-endian pieces both wire forms are made of.
namespace metadata_wire {
inline void put_u32(std::vector<std::byte>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<std::byte>(v >> (8 * i)));
}
inline void put_str(std::vector<std::byte>* out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out->insert(out->end(), p, p + s.size());
}
// Bounds-checked reads; false once the input is short.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> in) : in_(in) {}
  bool u32(uint32_t* v) {
    if (in_.size() - pos_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= std::to_integer<uint32_t>(in_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool bytes(size_t n, std::string* s) {
    if (in_.size() - pos_ < n) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};
}  // namespace metadata_wire

}  // namespace rdmakit::cp
