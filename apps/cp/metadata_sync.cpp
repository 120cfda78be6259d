#include "metadata_sync.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rdmakit::cp {

MetaSync::MetaSync(uint32_t sync, Report* report)
    : owner_(sync & kSyncOwner),
      group_(sync & kSyncGroup),
      numeric_(sync & kSyncNumericIds),
      xattrs_(sync & kSyncXattrs),
      acls_(sync & kSyncAcls),
      report_(report) {}

std::string MetaSync::describe(const Entry& src, const SourceRoot&, int, EntryRecord* e) {
  if (owner_ || group_) {
    e->flags |= kEntryOwner;
    e->uid = src.uid;
    e->gid = src.gid;
  }
  return "";
}

int64_t MetaSync::local_uid(const EntryRecord& e) const {
  if (!owner_ || !(e.flags & kEntryOwner) || ::geteuid() != 0) return -1;
  return e.uid;
}

int64_t MetaSync::local_gid(const EntryRecord& e) const {
  if (!group_ || !(e.flags & kEntryOwner)) return -1;
  return e.gid;
}

uint16_t MetaSync::changes(const EntryRecord& e, const struct stat& st, int, int,
                           const std::string&) {
  uint16_t items = 0;
  const int64_t uid = local_uid(e), gid = local_gid(e);
  if (uid >= 0 && st.st_uid != uid) items |= kItemOwner;
  if (gid >= 0 && st.st_gid != gid) items |= kItemGroup;
  return items;
}

std::string MetaSync::apply(const EntryRecord& e, int fd, int parent,
                            const std::string& name, uint16_t items) {
  const int64_t uid = (items & kItemOwner) ? local_uid(e) : -1;
  const int64_t gid = (items & kItemGroup) ? local_gid(e) : -1;
  if (uid < 0 && gid < 0) return "";
  const int rc = fd >= 0 ? ::fchown(fd, static_cast<uid_t>(uid), static_cast<gid_t>(gid))
                         : ::fchownat(parent, name.c_str(), static_cast<uid_t>(uid),
                                      static_cast<gid_t>(gid), AT_SYMLINK_NOFOLLOW);
  if (rc != 0) return std::string("cannot change owner: ") + std::strerror(errno);
  (void)report_;
  return "";
}

}  // namespace rdmakit::cp
