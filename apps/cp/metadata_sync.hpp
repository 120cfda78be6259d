#pragma once
// The attributes a sync keeps beyond mode and mtime: ownership (-o, -g,
// --numeric-ids), ACLs (-A) and extended attributes (-X). The sender
// describes them per entry; the receiver compares them with the destination
// (for -i and the quick check) and applies them.
#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "records.hpp"
#include "report.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

class MetaSync {
 public:
  MetaSync(uint32_t sync, Report* report);
  bool any() const { return owner_ || group_ || xattrs_ || acls_; }
  // Sender: fills the owner and attribute fields of a listed entry; the
  // source is `fd` if open, else `path` beneath `root` (never followed).
  std::string describe(const Entry& src, const SourceRoot& root, int fd, EntryRecord* e);
  // Receiver: kItemOwner / kItemGroup / kItemAcl / kItemXattr for what differs
  // (and can be applied by this process).
  uint16_t changes(const EntryRecord& e, const struct stat& st, int fd, int parent,
                   const std::string& name);
  // Receiver: applies them to `fd` if open, else to parent + name (not
  // followed). Returns "" or the reason.
  std::string apply(const EntryRecord& e, int fd, int parent, const std::string& name,
                    uint16_t items);

 private:
  int64_t local_uid(const EntryRecord& e) const;
  int64_t local_gid(const EntryRecord& e) const;
  bool owner_, group_, numeric_, xattrs_, acls_;
  Report* report_;
};

}  // namespace rdmakit::cp
