#include "metadata_sync.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "confine.hpp"

namespace rdmakit::cp {

namespace {

bool is_acl(const std::string& name) { return name.rfind("system.posix_acl_", 0) == 0; }

// Which of the two letters differs between two sorted attribute lists.
uint16_t compare_xattrs(const std::vector<Xattr>& a, const std::vector<Xattr>& b) {
  uint16_t items = 0;
  auto part = [](const std::vector<Xattr>& v, bool acl) {
    std::vector<Xattr> out;
    std::copy_if(v.begin(), v.end(), std::back_inserter(out),
                 [&](const Xattr& x) { return is_acl(x.name) == acl; });
    return out;
  };
  if (part(a, true) != part(b, true)) items |= kItemAcl;
  if (part(a, false) != part(b, false)) items |= kItemXattr;
  return items;
}

}  // namespace

MetaSync::MetaSync(uint32_t sync, bool trust_privileged)
    : owner_(sync & kSyncOwner),
      group_(sync & kSyncGroup),
      numeric_(sync & kSyncNumericIds),
      ids_(numeric_) {
  select_.xattrs = sync & kSyncXattrs;
  select_.acls = sync & kSyncAcls;
  select_.privileged = trust_privileged;
  if (owner_ || group_) can_chown_ = have_capability(CAP_CHOWN);
}

std::string MetaSync::describe(const Entry& src, const SourceRoot& root, EntryRecord* e) {
  if (owner_ || group_) {
    struct stat st {};
    st.st_uid = src.uid;
    st.st_gid = src.gid;
    const Owner o = owner_of(st, numeric_);
    e->flags |= kEntryOwner;
    e->uid = o.uid;
    e->gid = o.gid;
    e->user = o.user;
    e->group = o.group;
  }
  if (!select_.xattrs && !select_.acls) return "";
  std::vector<Xattr> list;
  std::string why;
  if (root.confined) {
    auto [dir, name] = split_parent(src.open);
    const int parent = dir == "." ? ::dup(root.base)
                                  : open_beneath(root.base, dir, O_PATH | O_DIRECTORY);
    if (parent < 0) return std::string("attributes: ") + std::strerror(-parent);
    why = read_xattrs(-1, parent, name.c_str(), select_, &list);
    ::close(parent);
  } else {
    why = read_xattrs(-1, root.base, src.open.c_str(), select_, &list);
  }
  if (!why.empty()) return "attributes not sent: " + why;
  std::vector<std::byte> blob;
  encode_xattrs(list, &blob);
  if (blob.size() > kMaxXattrBlob)
    return "attributes not sent: over " + std::to_string(kMaxXattrBlob / 1024) +
           " KiB in all";
  e->flags |= kEntryXattrs;
  e->xattrs = std::move(blob);
  return "";
}

ChownPlan MetaSync::plan(const EntryRecord& e) {
  if (!(e.flags & kEntryOwner) || (!owner_ && !group_)) return {};
  const Owner o{e.uid, e.gid, e.user, e.group};
  return plan_chown(owner_, group_, ids_.uid(o), ids_.gid(o), can_chown_);
}

// The peer's attributes this process applies: malformed lists and names
// outside the selection (a privileged one from an untrusted peer) are left out.
bool MetaSync::wanted(const EntryRecord& e, std::vector<Xattr>* out) const {
  out->clear();
  if ((!select_.xattrs && !select_.acls) || !(e.flags & kEntryXattrs)) return false;
  size_t used = 0;
  std::string why;
  if (!decode_xattrs(e.xattrs, &used, out, &why) || used != e.xattrs.size()) return false;
  std::erase_if(*out, [&](const Xattr& x) {
    if (is_acl(x.name)) return !select_.acls;
    if (x.name.rfind("user.", 0) == 0) return !select_.xattrs;
    return !select_.xattrs || !select_.privileged;
  });
  return true;
}

uint16_t MetaSync::changes(const EntryRecord& e, const struct stat& st, int fd,
                           int parent, const std::string& name) {
  uint16_t items = 0;
  const ChownPlan p = plan(e);
  if (p.uid >= 0 && st.st_uid != p.uid) items |= kItemOwner;
  if (p.gid >= 0 && st.st_gid != p.gid) items |= kItemGroup;
  std::vector<Xattr> want, have;
  if (wanted(e, &want)) {
    const std::string why = fd >= 0
                                ? read_xattrs(fd, -1, nullptr, select_, &have)
                                : read_xattrs(-1, parent, name.c_str(), select_, &have);
    if (why.empty()) items |= compare_xattrs(want, have);
  }
  return items;
}

std::string MetaSync::apply(const EntryRecord& e, int fd, int parent,
                            const std::string& name, uint16_t items) {
  std::string why;
  const ChownPlan p = plan(e);
  const int64_t uid = (items & kItemOwner) ? p.uid : -1;
  const int64_t gid = (items & kItemGroup) ? p.gid : -1;
  if (uid >= 0 || gid >= 0) {
    const auto u = static_cast<uid_t>(uid), g = static_cast<gid_t>(gid);
    const int rc = fd >= 0 ? ::fchown(fd, u, g)
                           : ::fchownat(parent, name.c_str(), u, g, AT_SYMLINK_NOFOLLOW);
    if (rc != 0) why = std::string("cannot change the owner: ") + std::strerror(errno);
  }
  std::vector<Xattr> want;
  if ((items & (kItemAcl | kItemXattr)) && wanted(e, &want)) {
    const std::string err = fd >= 0
                                ? apply_xattrs(fd, -1, nullptr, select_, want)
                                : apply_xattrs(-1, parent, name.c_str(), select_, want);
    if (!err.empty()) why += (why.empty() ? "" : "; ") + err;
  }
  return why;
}

}  // namespace rdmakit::cp
