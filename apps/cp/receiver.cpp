#include "receiver.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "confine.hpp"
#include "limits.hpp"
#include "records.hpp"

namespace rdmakit::cp {

namespace {

int open_dir(int root, const std::string& path, bool confined) {
  if (confined) return open_beneath(root, path, O_RDONLY | O_DIRECTORY);
  const int fd = ::openat(root, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return fd >= 0 ? fd : -errno;
}

std::string errno_reason(int err) {
  if (err == ENOSPC) return "no space left on device";
  if (err == EACCES || err == EPERM)
    return std::string("permission denied (") + std::strerror(err) + ")";
  if (err == EXDEV) return "refused: the path leaves the destination";
  return std::strerror(err);
}

// How long a part file another transfer holds is waited for (x 10 ms).
constexpr int kLockAttempts = 500;

bool write_all(int fd, const std::byte* p, size_t n, uint64_t off, int* err) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w <= 0) {
      *err = w < 0 ? errno : EIO;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

}  // namespace

bool resolve_target(int root, const std::string& dst_in, bool confined, uint32_t nsources,
                    Target* out, Failure* kind, std::string* reason) {
  std::string dst = dst_in.empty() ? "." : dst_in;
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  if (confined) {
    const std::string why = check_relative(dst);
    if (!why.empty()) {
      *kind = Failure::kRefused;
      *reason = "refused: " + why;
      return false;
    }
  }
  int fd = open_dir(root, dst, confined);
  if (fd >= 0) {
    out->base = fd;
    return true;
  }
  if (fd == -EXDEV) {
    *kind = Failure::kRefused;
    *reason = "refused: the path leaves the served root";
    return false;
  }
  if (fd != -ENOENT && fd != -ENOTDIR) {
    *kind = classify_errno(-fd);
    *reason = errno_reason(-fd);
    return false;
  }
  if (nsources != 1) {
    *kind = Failure::kFile;
    *reason = "not a directory (needed for several sources)";
    return false;
  }
  auto [parent, name] = split_parent(dst);
  if (name.empty() || name == "." || name == "..") {
    *kind = Failure::kUsage;
    *reason = "cannot copy to that name";
    return false;
  }
  fd = open_dir(root, parent, confined && parent != "/");
  if (fd < 0) {
    *kind = fd == -EXDEV ? Failure::kRefused : classify_errno(-fd);
    *reason = parent + ": " + errno_reason(-fd);
    return false;
  }
  out->base = fd;
  out->rename_top = name;
  return true;
}

Receiver::Receiver(ReceiverConfig config)
    : c_(std::move(config)),
      meta_(c_.sync, c_.preserve_special),
      // A sender has at most kSlots slots in flight per lane, from the one
      // the writer waits for on (acks run ahead of it by a little).
      window_(2 * kSlots *
              static_cast<uint32_t>(std::min<size_t>(c_.lanes.size() + 1, kMaxLanes))) {
  lanes_.push_back({c_.channel, c_.slots, c_.channel->endpoint().peer()});
  for (const ReceiverLane& l : c_.lanes)
    if (lanes_.size() < kMaxLanes) lanes_.push_back(l);
}

Receiver::~Receiver() {
  close_file();
  if (parent_ >= 0) ::close(parent_);
}

void Receiver::send(Writer& w) {
  const session::OpResult r = c_.channel->send(std::span<const std::byte>(w.data()));
  if (!r.ok()) {
    std::lock_guard lock(mu_);
    abort_ = true;
    cv_.notify_all();
  }
}

void Receiver::send_ack(uint32_t lane, uint32_t slot, uint32_t seq, bool ok) {
  Writer w = message(Msg::kAck);
  w.put<uint32_t>(lane).put<uint32_t>(slot).put<uint32_t>(seq).put<uint8_t>(ok ? 1 : 0);
  send(w);
}

void Receiver::fatal(Failure kind, const std::string& reason, bool tell_peer) {
  c_.report->error(kind, "", reason);
  if (tell_peer) {
    Writer w = message(Msg::kFatal);
    w.put<uint8_t>(static_cast<uint8_t>(kind)).str(reason);
    send(w);
  }
  std::lock_guard lock(mu_);
  abort_ = true;
  cv_.notify_all();
}

std::string map_wire_path(const Target& target, const std::string& rel,
                          std::string* why) {
  *why = check_relative(rel);
  if (!why->empty()) return "";
  for (size_t start = 0;;) {  // "." components are refused too: one name, one entry
    const size_t end = rel.find('/', start);
    if (rel.substr(start, end == std::string::npos ? end : end - start) == ".") {
      *why = "'.' components are refused";
      return "";
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (target.rename_top.empty()) return rel;
  const size_t slash = rel.find('/');
  return target.rename_top + (slash == std::string::npos ? "" : rel.substr(slash));
}

int Receiver::parent_fd(const std::string& dir) {
  if (parent_ >= 0 && dir == parent_path_) return parent_;
  if (parent_ >= 0) ::close(parent_);
  parent_ = -1;
  const int fd = dir == "." ? ::dup(c_.target.base)
                            : open_beneath(c_.target.base, dir, O_PATH | O_DIRECTORY);
  if (fd < 0) return fd;
  parent_ = fd;
  parent_path_ = dir;
  return fd;
}

void Receiver::fail_file(Failure kind, const std::string& reason) {
  if (cur_.failed) return;
  cur_.failed = true;
  c_.report->error(kind, cur_.path, reason);
  Writer w = message(Msg::kFileError);
  w.put<uint8_t>(static_cast<uint8_t>(kind)).str(cur_.path).str(reason);
  send(w);
  if (cur_.fd >= 0) {
    // A part file that failed verification is worthless; one that failed
    // on I/O may be resumed.
    if (kind == Failure::kVerify) ::unlinkat(cur_.part_dir, cur_.tmp.c_str(), 0);
  }
  close_file();
}

void Receiver::close_file() {
  if (cur_.fd >= 0) ::close(cur_.fd);
  if (cur_.part_dir >= 0 && cur_.part_dir != cur_.parent) ::close(cur_.part_dir);
  cur_.part_dir = -1;
  cur_.fd = -1;
  cur_.open = false;
}

bool Receiver::on_entry(Reader& rd) {
  if (hasher_.active()) hasher_.finish();
  close_file();
  cur_ = File{};
  EntryRecord rec;
  std::string why;
  const Parsed parsed = parse_entry(rd, &rec, &why);
  if (parsed == Parsed::kMalformed) return false;
  cur_.id = rec.id;
  const auto kind = static_cast<Kind>(rec.kind);
  cur_.mode = applied_mode(rec.mode, c_.preserve_special);
  cur_.sec = rec.sec;
  cur_.nsec = rec.nsec;
  cur_.size = rec.size;
  const std::string rel = rec.path;
  if (parsed == Parsed::kRefused) {
    cur_.path = rel;
    cur_.size = 0;
    fail_file(Failure::kRefused, why);
    return true;
  }
  if (kind == Kind::kFile) {
    why = admit_size(cur_.size);
    if (!why.empty()) {
      cur_.path = rel;
      cur_.size = 0;
      fail_file(why.rfind("no space", 0) == 0 ? Failure::kFile : Failure::kRefused, why);
      return true;
    }
  }
  cur_.path = map_wire_path(c_.target, rel, &why);
  if (!cur_.path.empty() && !top_allowed(c_.tops, rel)) {
    cur_.path.clear();
    why = "not beneath a name that was asked for";
  }
  if (cur_.path.empty()) {
    cur_.path = rel;
    fail_file(Failure::kRefused, "refused: " + why);
    return true;
  }
  auto [dir, name] = split_parent(cur_.path);
  cur_.name = name;
  cur_.tmp = part_name(name);
  const int parent = parent_fd(dir);
  if (parent < 0) {
    fail_file(-parent == EXDEV ? Failure::kRefused : Failure::kFile,
              dir + ": " + errno_reason(-parent));
    return true;
  }
  cur_.parent = parent;
  // Whatever is made here changes the directory's mtime: it is set again
  // at the end (fix_dirs).
  touched_.insert(dir);
  switch (kind) {
    case Kind::kDir: {
      struct stat st {};
      if (::mkdirat(parent, name.c_str(), 0700) != 0 &&
          !(errno == EEXIST &&
            ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(st.st_mode))) {
        fail_file(Failure::kFile, errno == EEXIST ? "exists and is not a directory"
                                                  : errno_reason(errno));
        return true;
      }
      dirs_.push_back({cur_.path, std::move(rec)});
      cur_.failed = true;  // no data follows
      return true;
    }
    case Kind::kSymlink:
    case Kind::kHardlink:
      on_link(rec, parent, kind);
      cur_.failed = true;  // done; no data follows
      return true;
    case Kind::kFile: break;
    default: return false;
  }
  open_part(rec, parent);
  if (cur_.open) c_.report->file_started(rec.path, cur_.size);
  cur_.rec = std::move(rec);
  return true;
}

// A symlink or a hard link to an earlier entry of this transfer.
void Receiver::on_link(const EntryRecord& rec, int parent, Kind kind) {
  if (kind == Kind::kHardlink) {
    std::string why;
    const std::string first = map_wire_path(c_.target, rec.link, &why);
    if (!first.empty() && !generator_->listed_file(first))
      why = "not a file of this transfer";
    if (first.empty() || !generator_->listed_file(first)) {
      fail_file(Failure::kRefused, "refused: hard link to " + rec.link + ": " + why);
      return;
    }
    auto [first_dir, first_name] = split_parent(first);
    const int first_parent =
        first_dir == "." ? ::dup(c_.target.base)
                         : open_beneath(c_.target.base, first_dir, O_PATH | O_DIRECTORY);
    if (first_parent < 0) {
      fail_file(classify_errno(-first_parent),
                "hard link to " + rec.link + ": " + errno_reason(-first_parent));
      return;
    }
    // Both parents were resolved beneath the target; the link is made
    // under a temporary name, checked and renamed (metadata.hpp).
    why = make_hardlink(first_parent, first_name.c_str(), parent, cur_.name.c_str());
    ::close(first_parent);
    if (!why.empty()) {
      fail_file(Failure::kFile, why);
      return;
    }
    c_.report->files_done++;
    return;
  }
  // A symlink is made under the part name and renamed over the final one.
  ::unlinkat(parent, cur_.tmp.c_str(), 0);
  if (::symlinkat(rec.link.c_str(), parent, cur_.tmp.c_str()) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  const std::string why = meta_.apply(rec, -1, parent, cur_.tmp, kItemOwner | kItemGroup);
  if (!why.empty()) c_.report->error(Failure::kFile, cur_.path, why);
  if (::renameat(parent, cur_.tmp.c_str(), parent, cur_.name.c_str()) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    ::unlinkat(parent, cur_.tmp.c_str(), 0);
    return;
  }
  const timespec times[2] = {{0, UTIME_OMIT}, {cur_.sec, static_cast<long>(cur_.nsec)}};
  ::utimensat(parent, cur_.name.c_str(), times, AT_SYMLINK_NOFOLLOW);
  c_.report->files_done++;
}

void Receiver::open_part(const EntryRecord& rec, int parent) {
  const uint32_t nblocks = block_count(cur_.size);
  cur_.hashes.assign(nblocks, 0);
  cur_.needed.assign(nblocks, true);
  const bool from_part = rec.flags & kEntryBasisPart;
  const bool from_final = rec.flags & kEntryBasisFinal;
  if (from_part || from_final) cur_.needed = rec.sent;
  // A part file is owner read/write only while it is written: group or
  // other write bits would let another user change bytes after they were
  // verified. Its final mode is set by on_end's fchmod (always: under a
  // default ACL the umask does not decide the created mode).
  cur_.create_mode = 0600;
  // Another transfer may still be writing this part file (a killed
  // client's, until the server sees it gone): each writer holds an flock
  // on it, and the name must still be the locked file once it is ours.
  int fd = -1;
  struct stat st {};
  cur_.part_dir = parent;
  if (!c_.partial_dir.empty()) {
    // --partial-dir: DIR/NAME beside NAME, made when first needed.
    cur_.tmp = cur_.name;
    ::mkdirat(parent, c_.partial_dir.c_str(), 0700);
    cur_.part_dir = ::openat(parent, c_.partial_dir.c_str(),
                             O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cur_.part_dir < 0) {
      fail_file(classify_errno(errno), c_.partial_dir + ": " + errno_reason(errno));
      return;
    }
  }
  for (int attempt = 0;; ++attempt) {
    fd = ::openat(cur_.part_dir, cur_.tmp.c_str(),
                  O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, cur_.create_mode);
    if (fd < 0) {
      fail_file(classify_errno(errno), errno_reason(errno));
      return;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      if (attempt >= kLockAttempts) {
        fail_file(Failure::kFile, "another transfer is writing this file");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    struct stat named {};
    if (::fstat(fd, &st) == 0 &&
        ::fstatat(cur_.part_dir, cur_.tmp.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
        named.st_ino == st.st_ino && named.st_dev == st.st_dev)
      break;
    ::close(fd);  // renamed or removed by the other writer meanwhile
  }
  if (!from_part && st.st_size != 0 && ::ftruncate(fd, 0) != 0) {
    ::close(fd);
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  cur_.created = !from_part;
  cur_.fd = fd;
  cur_.open = true;
  // A new part file is sized at its end, and only if its last bytes are a
  // hole: most files are written up to their size anyway.
  if (!cur_.created || from_final) {
    if (::ftruncate(fd, static_cast<off_t>(cur_.size)) != 0) {
      fail_file(classify_errno(errno), errno_reason(errno));
      return;
    }
  }
  if (from_final) {
    const int basis =
        ::openat(parent, cur_.name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (basis < 0) {
      fail_file(Failure::kFile, "the file to update vanished: " + errno_reason(errno));
      return;
    }
    const bool ok = copy_from_basis(basis);
    ::close(basis);
    if (!ok) return;
  }
  if (from_part) {
    // Blocks to be sent start as holes: the sender sends only data. The
    // others are kept, and hashed as they are for the file hash.
    bool io_error = false;
    for (uint32_t b = 0; b < nblocks; ++b) {
      if (!cur_.needed[b]) {
        cur_.hashes[b] = hash_file_block(fd, cur_.size, b, &scratch_, &io_error);
        continue;
      }
      const uint64_t off = uint64_t{b} * kBlockSize;
      const uint64_t len = std::min<uint64_t>(kBlockSize, cur_.size - off);
      if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
        static const std::vector<std::byte> zero(kBlockSize);
        int err = 0;
        if (!write_all(fd, zero.data(), len, off, &err)) {
          fail_file(classify_errno(err), errno_reason(err));
          return;
        }
      }
    }
    if (io_error) fail_file(Failure::kFile, "read error in the part file");
  }
}

// Delta against the file under its final name: the blocks the sender does
// not send are copied from it, hashed as they are written (so the file hash
// checks them too), and holes stay holes.
bool Receiver::copy_from_basis(int basis) {
  struct stat st {};
  if (::fstat(basis, &st) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return false;
  }
  const auto have = static_cast<uint64_t>(st.st_size);
  for (uint32_t b = 0; b < cur_.needed.size(); ++b) {
    if (cur_.needed[b]) continue;
    const uint64_t off = uint64_t{b} * kBlockSize;
    const uint64_t len = std::min<uint64_t>(kBlockSize, cur_.size - off);
    if (!range_within(off, len, have)) {
      fail_file(Failure::kVerify, "the file to update changed (shorter than its hashes)");
      return false;
    }
    const off_t data = ::lseek(basis, static_cast<off_t>(off), SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= off + len) continue;  // a hole
    scratch_.resize(len);
    uint64_t got = 0;
    while (got < len) {
      const ssize_t n =
          ::pread(basis, scratch_.data() + got, len - got, static_cast<off_t>(off + got));
      if (n <= 0) break;
      got += static_cast<uint64_t>(n);
    }
    int err = EIO;
    if (got != len || !write_all(cur_.fd, scratch_.data(), len, off, &err)) {
      fail_file(classify_errno(err), errno_reason(err));
      return false;
    }
    const uint64_t h = XXH3_64bits(scratch_.data(), len);
    cur_.hashes[b] = h == 0 ? 1 : h;
    cur_.written_end = std::max(cur_.written_end, off + len);
    c_.report->bytes_matched += len;
  }
  return true;
}

std::string Receiver::admit_size(uint64_t size) {
  if (c_.max_bytes != 0 && (size > c_.max_bytes || declared_ > c_.max_bytes - size))
    return "refused: over this transfer's byte limit (" + std::to_string(c_.max_bytes) +
           " bytes, --max-client-bytes at the server; " + std::to_string(declared_) +
           " declared before this file of " + std::to_string(size) + ")";
  std::string why;
  if (!fits_free_space(c_.target.base, size, &why)) return why;
  declared_ += size;
  return "";
}

bool Receiver::on_data(Reader& rd) {
  DataRecord d;
  if (parse_data(rd, &d) != Parsed::kOk) return true;  // the slot is malformed
  if (d.id != cur_.id || !cur_.open || cur_.failed) return true;
  const uint64_t off = d.offset;
  const uint32_t len = d.len;
  const uint64_t digest = d.digest;
  const auto bytes = d.bytes;
  // Within the declared size (checked without overflow), one block, a block
  // of this file: only then index by it.
  if (!data_in_file(d, cur_.size) || off / kBlockSize >= cur_.needed.size()) {
    fail_file(Failure::kVerify, "malformed data record (outside the declared size " +
                                    std::to_string(cur_.size) + ")");
    return true;
  }
  const uint32_t b = static_cast<uint32_t>(off / kBlockSize);
  if (!cur_.needed[b] || (hasher_.active() && (b < hasher_.block()))) {
    fail_file(Failure::kVerify, "malformed data record");
    return true;
  }
  if (c_.max_bytes != 0 && written_ + len > c_.max_bytes) {
    fail_file(Failure::kRefused, "refused: this transfer wrote its byte limit (" +
                                     std::to_string(c_.max_bytes) +
                                     " bytes, --max-client-bytes at the server)");
    return true;
  }
  if (hasher_.active() && hasher_.block() != b)
    cur_.hashes[hasher_.block()] = hasher_.finish();
  if (!hasher_.active()) hasher_.start(b, cur_.size);
  // The only pass over the bytes before they are written: it checks them
  // against the sender's running digest of the block and carries the block
  // hash on. The record (at most a slot, 1 MiB) is still in the cache for
  // the write that follows.
  hasher_.checkpoint();
  hasher_.data(off, bytes);
  if (hasher_.digest() != digest) {
    hasher_.rollback();
    return false;
  }
  int err = 0;
  if (!write_all(cur_.fd, bytes.data(), bytes.size(), off, &err)) {
    fail_file(classify_errno(err), errno_reason(err));
    return true;
  }
  cur_.written_end = std::max<uint64_t>(cur_.written_end, off + len);
  written_ += len;
  c_.report->bytes_sent += len;
  return true;
}

void Receiver::on_end(Reader& rd) {
  const auto id = rd.get<uint32_t>();
  const auto expect = rd.get<uint64_t>();
  if (!rd.ok() || id != cur_.id) return;
  if (hasher_.active()) {
    const uint32_t b = hasher_.block();
    cur_.hashes[b] = hasher_.finish();
  }
  if (!cur_.open || cur_.failed) return;
  if (file_hash(cur_.hashes) != expect) {
    fail_file(Failure::kVerify, "file hash mismatch (xxh3 of the received blocks)");
    return;
  }
  const timespec times[2] = {{0, UTIME_OMIT}, {cur_.sec, static_cast<long>(cur_.nsec)}};
  if ((cur_.created && cur_.written_end < cur_.size &&
       ::ftruncate(cur_.fd, static_cast<off_t>(cur_.size)) != 0) ||
      ::fchmod(cur_.fd, cur_.mode) != 0 || ::futimens(cur_.fd, times) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  // Owner before the rename, so the file never appears with the wrong one
  // (a chown clears setuid bits: the mode is set again after it).
  const std::string meta_error = meta_.apply(
      cur_.rec, cur_.fd, -1, "", kItemOwner | kItemGroup | kItemAcl | kItemXattr);
  if (!meta_error.empty()) c_.report->error(Failure::kFile, cur_.path, meta_error);
  if ((meta_.any() && ::fchmod(cur_.fd, cur_.mode) != 0) || ::fsync(cur_.fd) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  if (::renameat(cur_.part_dir, cur_.tmp.c_str(), cur_.parent, cur_.name.c_str()) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  if (!c_.partial_dir.empty())  // gone once empty, as rsync's
    ::unlinkat(cur_.parent, c_.partial_dir.c_str(), AT_REMOVEDIR);
  close_file();
  c_.report->files_done++;
  c_.report->bytes_done += cur_.size;
  c_.report->files_transferred++;
  c_.report->bytes_transferred += cur_.size;
  c_.report->file_finished();
}

void Receiver::on_abort(Reader& rd) {
  const auto id = rd.get<uint32_t>();
  const std::string reason = rd.str(4096);
  if (!rd.ok() || id != cur_.id) return;
  if (hasher_.active()) hasher_.finish();
  if (!cur_.failed)
    c_.report->error(Failure::kFile, cur_.path, "(at the sender) " + reason);
  cur_.failed = true;
  close_file();
}

Receiver::Applied Receiver::apply_slot(ReorderWindow::Place where, uint32_t* at) {
  const std::byte* mem = slot_mem(where.lane, where.slot);
  SlotHeader h;
  std::memcpy(&h, mem, sizeof h);
  // Read again from memory the sender can still write: bounded again (the
  // check when the slot arrived says nothing about this copy of it).
  if (h.payload_len > kSlotPayload || *at > h.payload_len) return Applied::kMalformed;
  // Records before *at were applied when this slot came before.
  Reader rd(std::span<const std::byte>(mem + sizeof h + *at, h.payload_len - *at));
  while (!rd.at_end()) {
    const size_t start = rd.pos();
    const auto type = static_cast<Rec>(rd.get<uint8_t>());
    switch (type) {
      case Rec::kEntry:
        if (!on_entry(rd)) return Applied::kMalformed;
        break;
      case Rec::kData:
        if (!on_data(rd)) {
          *at += static_cast<uint32_t>(start);
          return Applied::kDamaged;
        }
        break;
      case Rec::kEnd: on_end(rd); break;
      case Rec::kAbort: on_abort(rd); break;
      default: return Applied::kMalformed;
    }
    if (!rd.ok()) return Applied::kMalformed;
  }
  *at = 0;
  return Applied::kDone;
}

void Receiver::fix_dirs() {
  // Deepest first, after their contents: mtimes stay, read-only dirs can fill.
  std::unordered_set<std::string> fixed;
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    fixed.insert(it->path);
    const int fd =
        open_beneath(c_.target.base, it->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) continue;
    const EntryRecord& rec = it->rec;
    const std::string why =
        meta_.apply(rec, fd, -1, "", kItemOwner | kItemGroup | kItemAcl | kItemXattr);
    if (!why.empty()) c_.report->error(Failure::kFile, it->path, why);
    const timespec times[2] = {{0, UTIME_OMIT}, {rec.sec, static_cast<long>(rec.nsec)}};
    if (::fchmod(fd, applied_mode(rec.mode, c_.preserve_special)) != 0 ||
        ::futimens(fd, times) != 0)
      c_.report->error(classify_errno(errno), it->path, errno_reason(errno));
    ::close(fd);
  }
  // Directories that were right (not sent) but had something made or
  // removed in them: their mtime again.
  if (!generator_->finished()) return;  // the stream ended before its list
  std::unordered_set<std::string> touched = std::move(touched_);
  touched.insert(generator_->touched_dirs().begin(), generator_->touched_dirs().end());
  for (const std::string& dir : touched) {
    if (fixed.contains(dir)) continue;
    const Generator::DirTime* t = generator_->kept_dir(dir);
    if (t == nullptr) continue;
    const int fd = open_beneath(c_.target.base, dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) continue;
    const timespec times[2] = {{0, UTIME_OMIT}, {t->sec, static_cast<long>(t->nsec)}};
    if (::futimens(fd, times) != 0)
      c_.report->error(classify_errno(errno), dir, errno_reason(errno));
    ::close(fd);
  }
}

void Receiver::writer_loop() {
  uint32_t resume_at = 0;  // where to continue a slot that comes again
  while (true) {
    ReorderWindow::Place where;
    uint32_t seq = 0;
    {
      std::unique_lock lock(mu_);
      bool got = false;
      cv_.wait(lock, [&] {
        got = !abort_ && window_.take(&where);
        return abort_ || got || (total_seqs_ >= 0 && window_.next() == total_seqs_);
      });
      if (abort_) return;
      if (!got) break;  // stream complete
      seq = window_.next();
    }
    const Applied applied = apply_slot(where, &resume_at);
    if (applied == Applied::kMalformed) {
      fatal(Failure::kPeer,
            "protocol error: malformed records in chunk " + std::to_string(seq), true);
      return;
    }
    if (applied == Applied::kDamaged) {
      // File data damaged in flight: ask for the slot again and wait for it
      // (the same sequence number); the records before the damaged one are
      // applied already.
      c_.report->chunks_resent++;
      std::fprintf(stderr,
                   "rdmakit-cp: chunk %u: file data failed verification (xxh3 block "
                   "digest); asking again\n",
                   seq);
      send_ack(where.lane, where.slot, seq, false);
      continue;
    }
    send_ack(where.lane, where.slot, seq, true);
    std::lock_guard lock(mu_);
    window_.advance();
  }
  close_file();
  fix_dirs();
  Writer fin = message(Msg::kFinal);
  fin.put<uint64_t>(c_.report->files_done.load())
      .put<uint64_t>(c_.report->bytes_done.load());
  send(fin);
  std::lock_guard lock(mu_);
  writer_done_ = true;
  cv_.notify_all();
}

bool Receiver::run() {
  GeneratorConfig gc;
  gc.channel = c_.channel;
  gc.target = &c_.target;
  gc.sync = c_.sync;
  gc.resume = c_.resume || !c_.partial_dir.empty();
  gc.partial_dir = c_.partial_dir;
  gc.preserve_special = c_.preserve_special;
  gc.side = c_.side;
  gc.excluded = c_.excluded;
  gc.tops = c_.tops;
  gc.report = c_.report;
  generator_ = std::make_unique<Generator>(std::move(gc));
  std::thread writer([this] { writer_loop(); });
  std::vector<std::thread> lane_threads;
  for (uint32_t l = 1; l < lanes_.size(); ++l)
    lane_threads.emplace_back([this, l] { lane_loop(l); });
  bool ok = true;
  while (true) {
    // Once the sender is done, only re-sent chunks and errors can still
    // come, and the writer ends without a message: look at it every
    // millisecond then, not every 100 ms (a pull's client would wait).
    std::chrono::milliseconds wait{100};
    {
      std::lock_guard lock(mu_);
      if (writer_done_ || abort_) {
        ok = writer_done_ && !abort_;
        break;
      }
      if (total_seqs_ >= 0) wait = std::chrono::milliseconds(1);
    }
    session::Message m;
    const session::OpResult r = c_.channel->recv(&m, wait);
    if (r.code == session::Errc::kTimeout) continue;
    if (!r.ok()) {
      {
        std::unique_lock lock(mu_);
        // The sender may close as soon as it has the final report.
        cv_.wait_for(lock, std::chrono::milliseconds(500),
                     [&] { return writer_done_ || abort_; });
        if (writer_done_ && !abort_) break;
      }
      std::string detail = r.detail;
      if (c_.channel->endpoint().closed())
        detail = c_.channel->endpoint().disconnect_info().detail;
      fatal(Failure::kPeer, "peer gone: " + detail, false);
      ok = false;
      break;
    }
    if (m.is_notification()) {
      const uint32_t slot = m.imm();
      m.release();
      if (!on_chunk(0, slot)) {
        ok = false;
        break;
      }
      continue;
    }
    Reader rd(m.data());
    const auto type = static_cast<Msg>(rd.get<uint8_t>());
    switch (type) {
      case Msg::kTotals: {
        c_.report->total_files = rd.get<uint64_t>();
        c_.report->total_bytes = rd.get<uint64_t>();
        const uint64_t total = c_.report->total_bytes.load();
        if (rd.ok() && c_.max_bytes != 0 && total > c_.max_bytes)
          fatal(Failure::kRefused,
                "refused: the transfer declares " + std::to_string(total) +
                    " bytes, over this client's limit of " +
                    std::to_string(c_.max_bytes) + " (--max-client-bytes at the server)",
                true);
        break;
      }
      case Msg::kCheck:
      case Msg::kListEnd: {
        std::string why;
        const bool good = type == Msg::kCheck
                              ? generator_->on_check(m.data().subspan(1), &why)
                              : generator_->on_list_end(&why);
        if (!good) fatal(Failure::kPeer, why, true);
        break;
      }
      case Msg::kFileError: {
        const auto kind = static_cast<Failure>(rd.get<uint8_t>());
        std::string path = rd.str();
        std::string reason = rd.str();
        if (rd.ok() && kind <= Failure::kPeer)
          c_.report->error(kind, std::move(path), "(at the sender) " + reason);
        break;
      }
      case Msg::kDone: {
        const auto n = rd.get<uint32_t>();
        std::lock_guard lock(mu_);
        total_seqs_ = n;
        cv_.notify_all();
        break;
      }
      case Msg::kFatal: {
        const auto kind = static_cast<Failure>(rd.get<uint8_t>());
        fatal(kind > Failure::kPeer ? Failure::kPeer : kind, "sender: " + rd.str(),
              false);
        break;
      }
      default: fatal(Failure::kPeer, "protocol error: unexpected message", true); break;
    }
  }
  {
    std::lock_guard lock(mu_);
    abort_ = abort_ || !ok;
    cv_.notify_all();
  }
  writer.join();
  for (std::thread& t : lane_threads) t.join();
  generator_->stop();
  return ok && !generator_->failed();
}

}  // namespace rdmakit::cp
