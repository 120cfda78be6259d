#include "generator.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "confine.hpp"
#include "limits.hpp"
#include "receiver.hpp"
#include "tree.hpp"

namespace rdmakit::cp {

namespace {

// A batch message is sent once it is this large (kMaxMessage bounds it).
constexpr size_t kBatchBytes = 48 * 1024;
// A delta's basis hashes travel in one answer: files up to about 8 GiB.
constexpr uint32_t kMaxDeltaBlocks = (kMaxMessage - 1024) / sizeof(uint64_t);
// Below this a basis is not worth hashing: the file is sent whole.
constexpr uint64_t kMinDeltaBasis = 64 * 1024;

bool same_time(const EntryRecord& e, const struct stat& st) {
  return st.st_mtim.tv_sec == e.sec &&
         static_cast<uint32_t>(st.st_mtim.tv_nsec) == e.nsec;
}

void begin_batch(Writer* w, Msg type) {
  *w = message(type);
  w->put<uint32_t>(0);  // the count, patched when sent
}

}  // namespace

Generator::Generator(GeneratorConfig config)
    : c_(std::move(config)), meta_(c_.sync, c_.preserve_special) {
  thread_ = std::thread([this] { loop(); });
}

Generator::~Generator() {
  stop();
  if (parent_ >= 0) ::close(parent_);
}

void Generator::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Generator::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

bool Generator::on_check(std::span<const std::byte> body, std::string* why) {
  Reader rd(body);
  const auto n = rd.get<uint32_t>();
  std::lock_guard lock(mu_);
  if (!rd.ok() || n == 0 || list_end_) {
    *why = "protocol error: malformed entry list";
    return false;
  }
  listed_ += n;
  // The sender keeps at most kListWindow entries unanswered; a sender that
  // lists further ahead would make this queue grow without bound.
  if (listed_ - answered_ > 2 * uint64_t{kListWindow}) {
    *why = "protocol error: the sender listed " + std::to_string(listed_ - answered_) +
           " entries ahead of the answers";
    return false;
  }
  queue_.emplace_back(body.begin(), body.end());
  cv_.notify_all();
  return true;
}

bool Generator::on_list_end(std::string* why) {
  std::lock_guard lock(mu_);
  if (list_end_) {
    *why = "protocol error: the entry list ended twice";
    return false;
  }
  list_end_ = true;
  cv_.notify_all();
  return true;
}

void Generator::fail(const std::string& reason) {
  c_.report->error(Failure::kPeer, "", reason);
  Writer w = message(Msg::kFatal);
  w.put<uint8_t>(static_cast<uint8_t>(Failure::kPeer)).str(reason);
  (void)c_.channel->send(std::span<const std::byte>(w.data()));
  std::lock_guard lock(mu_);
  failed_ = true;
}

void Generator::loop() {
  for (;;) {
    std::vector<std::byte> body;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || list_end_; });
      if (stop_ || failed_) return;
      if (!queue_.empty()) {
        body = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (!body.empty()) {
      check_batch(body);
      continue;
    }
    if (c_.sync & kSyncDelete) delete_extraneous();
    flush_deleted();
    {
      std::lock_guard lock(mu_);
      finished_ = true;
    }
    Writer done = message(Msg::kListed);
    done.put<uint64_t>(c_.report->files_deleted.load());
    (void)c_.channel->send(std::span<const std::byte>(done.data()));
    return;
  }
}

void Generator::check_batch(const std::vector<std::byte>& body) {
  Reader rd(body);
  const auto n = rd.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    EntryRecord e;
    std::string why;
    const Parsed parsed = parse_entry(rd, &e, &why);
    // Ids increase through the whole list: the sender matches the answers
    // to its entries by them.
    if (parsed == Parsed::kMalformed || e.id <= last_id_) {
      fail("protocol error: malformed entry list");
      return;
    }
    last_id_ = e.id;
    c_.report->files_listed++;
    if (e.kind == static_cast<uint8_t>(Kind::kFile)) c_.report->bytes_listed += e.size;
    if (e.kind == static_cast<uint8_t>(Kind::kDir)) c_.report->dirs_listed++;
    if (e.kind == static_cast<uint8_t>(Kind::kSymlink)) c_.report->links_listed++;
    std::string dest;
    if (parsed == Parsed::kOk) dest = map_wire_path(*c_.target, e.path, &why);
    if (!dest.empty() && !top_allowed(c_.tops, e.path)) {
      dest.clear();
      why = "not beneath a name that was asked for";
    }
    Decision d;
    if (dest.empty()) {
      // Refused (a path that leaves the destination, a size over the
      // limit): the sender sends nothing for it.
      c_.report->error(Failure::kRefused, e.path, "refused: " + why);
      Writer err = message(Msg::kFileError);
      err.put<uint8_t>(static_cast<uint8_t>(Failure::kRefused)).str(e.path).str(why);
      (void)c_.channel->send(std::span<const std::byte>(err.data()));
    } else {
      d = decide(e, dest);
    }
    if (d.items != 0) {
      const auto kind = static_cast<Kind>(e.kind);
      c_.report->item(item_line(c_.side, kind, d.items, e.path, e.link),
                      e.path + (kind == Kind::kDir ? "/" : ""));
    }
    if (e.kind == static_cast<uint8_t>(Kind::kFile)) {
      if (d.items & kItemNew) c_.report->files_created++;
      if (d.want == Want::kSkip) c_.report->bytes_skipped += e.size;
    }
    if (c_.sync & kSyncDryRun) d = Decision{Want::kSkip, d.items, 0, {}};
    answer(e.id, d);
    c_.report->entries_answered++;
  }
  if (!rd.ok() || !rd.at_end()) {
    fail("protocol error: malformed entry list");
    return;
  }
  flush_answers();
  std::lock_guard lock(mu_);
  answered_ += n;
}

int Generator::parent_fd(const std::string& dir) {
  if (parent_ >= 0 && dir == parent_path_) return parent_;
  if (parent_ >= 0) ::close(parent_);
  parent_ = -1;
  const int fd = dir == "." ? ::dup(c_.target->base)
                            : open_beneath(c_.target->base, dir, O_PATH | O_DIRECTORY);
  if (fd < 0) return fd;
  parent_ = fd;
  parent_path_ = dir;
  return fd;
}

Generator::Decision Generator::decide(const EntryRecord& e, const std::string& dest) {
  Decision d;
  const auto kind = static_cast<Kind>(e.kind);
  if (c_.sync & kSyncDelete) {  // only deletions look at the whole list
    listed_paths_.insert(dest);
    if (kind == Kind::kDir) listed_dirs_.emplace_back(e.path, dest);
  }
  auto [dir, name] = split_parent(dest);
  deciding_dir_ = dir;
  const int parent = parent_fd(dir);
  struct stat st {};
  // A parent that does not exist yet is made by the writer: all is new.
  const bool exists =
      parent >= 0 && ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  std::string why;
  switch (kind) {
    case Kind::kDir:
      // The writer makes it and sets its attributes last. One that is
      // right is not sent; its mtime is set again only if something in it
      // changes (the writer's last pass).
      d.want = Want::kSend;
      if (exists && S_ISDIR(st.st_mode)) {
        d.items = attr_changes(e, st, -1, parent, name);
        if (d.items == 0) {
          d.want = Want::kSkip;
          kept_dirs_[dest] = DirTime{e.sec, e.nsec};
        }
      } else {
        if (exists && !remove(parent, name, e.path, false, false, false, &why))
          c_.report->error(Failure::kFile, e.path, why);
        if (exists) touch(dir);
        d.items = kItemNew;
      }
      break;
    case Kind::kSymlink: {
      char buf[kMaxPath];
      const ssize_t n = exists && S_ISLNK(st.st_mode)
                            ? ::readlinkat(parent, name.c_str(), buf, sizeof buf)
                            : -1;
      if (n >= 0 && std::string_view(buf, static_cast<size_t>(n)) == e.link) {
        d.items = attr_changes(e, st, -1, parent, name) & ~kItemPerms;
        d.want = d.items != 0 ? Want::kSend : Want::kSkip;
        break;
      }
      if (exists && (S_ISDIR(st.st_mode) || !S_ISLNK(st.st_mode))) touch(dir);
      if (exists && S_ISDIR(st.st_mode) &&
          !remove(parent, name, e.path, true, (c_.sync & kSyncDelete) != 0, false,
                  &why)) {
        c_.report->error(Failure::kFile, e.path, why);
        break;
      }
      d.items = kItemNew;
      if (exists && S_ISLNK(st.st_mode))
        d.items = kItemChecksum | (same_time(e, st) ? 0 : kItemTime);
      d.want = Want::kSend;
      break;
    }
    case Kind::kHardlink: {
      std::string first = map_wire_path(*c_.target, e.link, &why);
      if (first.empty() || !listed_file(first)) {
        c_.report->error(
            Failure::kRefused, e.path,
            "refused: a hard link to " + e.link + ", not a file of this transfer");
        break;
      }
      struct stat fst {};
      if (exists && !first.empty() &&
          ::fstatat(c_.target->base, first.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0 &&
          fst.st_ino == st.st_ino && fst.st_dev == st.st_dev)
        break;  // already the same file
      d.items = kItemNew;
      d.want = Want::kSend;
      break;
    }
    case Kind::kFile:
      if (c_.sync & kSyncHardLinks) {  // what a hard link may name
        std::lock_guard lock(files_mu_);
        files_.insert(dest);
      }
      decide_file(e, parent, name, exists ? &st : nullptr, &d);
      break;
  }
  return d;
}

void Generator::decide_file(const EntryRecord& e, int parent, const std::string& name,
                            const struct stat* st, Decision* d) {
  std::string why;
  if (st != nullptr && S_ISDIR(st->st_mode)) {
    touch(deciding_dir_);
    if (!remove(parent, name, e.path, true, (c_.sync & kSyncDelete) != 0, false, &why)) {
      c_.report->error(Failure::kFile, e.path, why);
      return;
    }
    st = nullptr;
  }
  const bool regular = st != nullptr && S_ISREG(st->st_mode);
  const bool same_size = regular && static_cast<uint64_t>(st->st_size) == e.size;
  bool up_to_date = same_size && same_time(e, *st) && !(c_.sync & kSyncIgnoreTimes);
  // Opened only to read it: for --checksum, attributes or a delta (most
  // files of a repeated sync are up to date and need only the stat).
  const bool read_it =
      regular && ((c_.sync & (kSyncChecksum | kSyncXattrs | kSyncAcls)) ||
                  (!up_to_date && !(c_.sync & kSyncWholeFile)));
  const int fd =
      read_it ? ::openat(parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
  std::vector<uint64_t> hashes;
  if (!regular) {
    d->items = kItemNew | kItemTransfer;
  } else {
    bool io_error = fd < 0;
    if ((c_.sync & kSyncChecksum) && fd >= 0) {
      hashes = block_hashes(fd, static_cast<uint64_t>(st->st_size), &io_error);
      up_to_date = same_size && !io_error && file_hash(hashes) == e.checksum;
    }
    const uint16_t attrs = attr_changes(e, *st, fd, parent, name);
    if (up_to_date) {
      d->items = attrs;
      if (attrs != 0 && !(c_.sync & kSyncDryRun)) fix_attrs(e, parent, name, attrs);
      c_.report->files_skipped++;
      if (fd >= 0) ::close(fd);
      return;
    }
    d->items = static_cast<uint16_t>(attrs | kItemTransfer | (same_size ? 0 : kItemSize) |
                                     ((c_.sync & kSyncChecksum) ? kItemChecksum : 0));
  }
  d->want = Want::kSend;
  // The basis: the part file of an interrupted run (--resume), else the
  // file under its name, unless the file is to be sent whole.
  int basis = -1;
  uint64_t basis_size = 0;
  if (c_.resume) {
    int part = -1;
    if (c_.partial_dir.empty()) {
      part = ::openat(parent, part_name(name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    } else {
      const int dir = ::openat(parent, c_.partial_dir.c_str(),
                               O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir >= 0) {
        part = ::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        ::close(dir);
      }
    }
    struct stat pst {};
    if (part >= 0 && ::fstat(part, &pst) == 0 && S_ISREG(pst.st_mode) &&
        pst.st_size > 0) {
      basis = part;
      basis_size = static_cast<uint64_t>(pst.st_size);
      d->basis = kEntryBasisPart;
      hashes.clear();
    } else if (part >= 0) {
      ::close(part);
    }
  }
  if (basis < 0 && !(c_.sync & kSyncWholeFile) && fd >= 0 &&
      static_cast<uint64_t>(st->st_size) >= kMinDeltaBasis) {
    basis = ::dup(fd);
    basis_size = static_cast<uint64_t>(st->st_size);
    d->basis = kEntryBasisFinal;
  }
  if (basis >= 0 && block_count(basis_size) <= kMaxDeltaBlocks) {
    bool basis_error = false;
    if (hashes.empty() || d->basis == kEntryBasisPart)
      hashes = block_hashes(basis, basis_size, &basis_error);
    if (!basis_error) {
      d->want = Want::kDelta;
      d->hashes = std::move(hashes);
    }
  }
  if (d->want != Want::kDelta) d->basis = 0;
  if (basis >= 0) ::close(basis);
  if (fd >= 0) ::close(fd);
}

uint16_t Generator::attr_changes(const EntryRecord& e, const struct stat& st, int fd,
                                 int parent, const std::string& name) {
  uint16_t items = 0;
  if ((st.st_mode & 07777) != applied_mode(e.mode, c_.preserve_special))
    items |= kItemPerms;
  if (!same_time(e, st)) items |= kItemTime;
  items |= meta_.changes(e, st, fd, parent, name);
  return items;
}

void Generator::fix_attrs(const EntryRecord& e, int parent, const std::string& name,
                          uint16_t items) {
  // Owner and attributes first: a chown clears setuid bits and an access
  // ACL rewrites the group bits, so the mode is set after them.
  const std::string why = meta_.apply(e, -1, parent, name, items);
  if (!why.empty()) c_.report->error(Failure::kFile, e.path, why);
  const char* n = name.c_str();
  int err = 0;
  if ((items & (kItemPerms | kItemOwner | kItemGroup | kItemAcl)) &&
      ::fchmodat(parent, n, applied_mode(e.mode, c_.preserve_special), 0) != 0)
    err = errno;
  if (items & kItemTime) {
    const timespec times[2] = {{0, UTIME_OMIT}, {e.sec, static_cast<long>(e.nsec)}};
    if (::utimensat(parent, n, times, AT_SYMLINK_NOFOLLOW) != 0) err = errno;
  }
  if (err != 0) c_.report->error(classify_errno(err), e.path, std::strerror(err));
}

bool Generator::remove(int parent, const std::string& name, const std::string& wire,
                       bool is_dir, bool recursive, bool report, std::string* why) {
  const bool dry = c_.sync & kSyncDryRun;
  if (!is_dir) {
    if (!dry && ::unlinkat(parent, name.c_str(), 0) != 0) {
      *why = std::string("cannot delete: ") + std::strerror(errno);
      return false;
    }
    if (report) deleted(wire, false);
    return true;
  }
  if (recursive) {
    const int fd =
        ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
    if (d == nullptr) {
      *why = std::string("cannot list for deletion: ") + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return false;
    }
    const std::vector<std::string> names = sorted_names(d);
    bool ok = true;
    for (const std::string& child : names) {
      struct stat st {};
      if (::fstatat(fd, child.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      ok =
          remove(fd, child, wire + "/" + child, S_ISDIR(st.st_mode), true, report, why) &&
          ok;
    }
    ::closedir(d);
    if (!ok) return false;
  }
  if (!dry && ::unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0) {
    *why = errno == ENOTEMPTY
               ? std::string("cannot replace a non-empty directory (--delete would)")
               : std::string("cannot delete: ") + std::strerror(errno);
    return false;
  }
  if (report) deleted(wire, true);
  return true;
}

void Generator::delete_extraneous() {
  const bool delete_excluded = c_.sync & kSyncDeleteExcluded;
  for (const auto& [wire, dest] : listed_dirs_) {
    const int fd =
        open_beneath(c_.target->base, dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
    if (d == nullptr) {
      if (fd >= 0) ::close(fd);
      continue;  // not made (dry run, or it failed and said so)
    }
    const std::vector<std::string> names = sorted_names(d);
    for (const std::string& name : names) {
      const std::string child = dest + "/" + name;
      // The writer's temporary hard link names (make_hardlink) are its own.
      if (listed_paths_.contains(child) || name == c_.partial_dir ||
          name.starts_with(".rdmakit-cp-link."))
        continue;
      // A listed file's part file may be being written right now.
      constexpr std::string_view kPart = ".rdmakit-cp-part";
      if (name.size() > kPart.size() + 1 && name[0] == '.' && name.ends_with(kPart) &&
          listed_paths_.contains(dest + "/" +
                                 name.substr(1, name.size() - 1 - kPart.size())))
        continue;
      struct stat st {};
      if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const bool is_dir = S_ISDIR(st.st_mode);
      const std::string child_wire = wire + "/" + name;
      if (!delete_excluded && c_.excluded && c_.excluded(child_wire, is_dir)) continue;
      touch(dest);
      std::string why;
      if (!remove(fd, name, child_wire, is_dir, true, true, &why))
        c_.report->error(Failure::kFile, child_wire, why);
    }
    ::closedir(d);
  }
}

void Generator::touch(const std::string& dest_dir) {
  if (!(c_.sync & kSyncDryRun)) touched_.insert(dest_dir);
}

bool Generator::finished() const {
  std::lock_guard lock(mu_);
  return finished_;
}

bool Generator::listed_file(const std::string& dest) const {
  std::lock_guard lock(files_mu_);
  return files_.contains(dest);
}

bool top_allowed(const std::vector<std::string>& tops, const std::string& wire) {
  if (tops.empty()) return true;
  const std::string top = wire.substr(0, wire.find('/'));
  return std::find(tops.begin(), tops.end(), top) != tops.end();
}

const Generator::DirTime* Generator::kept_dir(const std::string& dest) const {
  const auto it = kept_dirs_.find(dest);
  return it == kept_dirs_.end() ? nullptr : &it->second;
}

void Generator::deleted(const std::string& wire, bool is_dir) {
  c_.report->files_deleted++;
  c_.report->item(deleting_line(wire, is_dir), "deleting " + wire + (is_dir ? "/" : ""));
  if (deleted_count_ == 0) begin_batch(&deleted_, Msg::kDeleted);
  deleted_.put<uint8_t>(is_dir ? 1 : 0).str(wire);
  if (++deleted_count_ >= 1024 || deleted_.data().size() >= kBatchBytes) flush_deleted();
}

void Generator::flush_deleted() {
  if (deleted_count_ == 0) return;
  std::memcpy(deleted_.data().data() + 1, &deleted_count_, sizeof deleted_count_);
  (void)c_.channel->send(std::span<const std::byte>(deleted_.data()));
  deleted_count_ = 0;
}

void Generator::answer(uint32_t id, const Decision& d) {
  const size_t need = 16 + d.hashes.size() * sizeof(uint64_t);
  if (wants_count_ > 0 && wants_.data().size() + need > kMaxMessage - 64) flush_answers();
  if (wants_count_ == 0) begin_batch(&wants_, Msg::kWant);
  wants_.put<uint32_t>(id)
      .put<uint8_t>(static_cast<uint8_t>(d.want))
      .put<uint16_t>(d.items);
  if (d.want == Want::kDelta) {
    wants_.put<uint8_t>(d.basis).put<uint32_t>(static_cast<uint32_t>(d.hashes.size()));
    wants_.bytes(std::as_bytes(std::span(d.hashes)));
  }
  ++wants_count_;
  if (wants_.data().size() >= kBatchBytes) flush_answers();
}

void Generator::flush_answers() {
  if (wants_count_ == 0) return;
  std::memcpy(wants_.data().data() + 1, &wants_count_, sizeof wants_count_);
  (void)c_.channel->send(std::span<const std::byte>(wants_.data()));
  wants_count_ = 0;
}

}  // namespace rdmakit::cp
