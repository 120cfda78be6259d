#pragma once
// The attributes a sync keeps beyond mode and mtime: ownership (-o, -g,
// --numeric-ids), ACLs (-A) and extended attributes (-X). The sender
// describes them per entry; the receiver compares them with the destination
// (for -i and the quick check) and applies them (metadata.hpp does the
// system calls).
#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "metadata.hpp"
#include "records.hpp"
#include "report.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

class MetaSync {
 public:
  // trust_privileged: apply trusted.* and security.* attributes from the
  // peer (a server with --preserve-special; a pulling client with it).
  MetaSync(uint32_t sync, bool trust_privileged);
  bool any() const { return owner_ || group_ || select_.xattrs || select_.acls; }
  // Sender: fills the owner and attribute fields of a listed entry, read
  // from `open` beneath root (never followed). Returns "" or the reason.
  std::string describe(const Entry& src, const SourceRoot& root, EntryRecord* e);
  // Receiver: kItemOwner / kItemGroup / kItemAcl / kItemXattr for what differs
  // (and this process can apply). `fd` if open, else parent + name.
  uint16_t changes(const EntryRecord& e, const struct stat& st, int fd, int parent,
                   const std::string& name);
  // Receiver: applies the parts named by `items` to `fd` if open, else to
  // parent + name (not followed). Returns "" or the reason.
  std::string apply(const EntryRecord& e, int fd, int parent, const std::string& name,
                    uint16_t items);

 private:
  ChownPlan plan(const EntryRecord& e);
  bool wanted(const EntryRecord& e, std::vector<Xattr>* out) const;

  bool owner_, group_, numeric_;
  bool can_chown_ = false;  // CAP_CHOWN, asked once
  XattrSelect select_;
  IdMapper ids_;
};

}  // namespace rdmakit::cp
