#include "receiver.hpp"

#include <fcntl.h>
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

Receiver::Receiver(ReceiverConfig config) : c_(std::move(config)) {}

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

std::string Receiver::map_path(const std::string& rel, std::string* why) const {
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
  if (c_.target.rename_top.empty()) return rel;
  const size_t slash = rel.find('/');
  return c_.target.rename_top + (slash == std::string::npos ? "" : rel.substr(slash));
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
  if (cur_.fd >= 0 && !cur_.keep_final) {
    // A part file that failed verification is worthless; one that failed
    // on I/O may be resumed.
    if (kind == Failure::kVerify) ::unlinkat(cur_.parent, cur_.tmp.c_str(), 0);
  }
  close_file();
}

void Receiver::close_file() {
  if (cur_.fd >= 0) ::close(cur_.fd);
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
  const std::string& rel = rec.path;
  const std::string& link = rec.link;
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
  cur_.path = map_path(rel, &why);
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
  const timespec times[2] = {{0, UTIME_OMIT}, {cur_.sec, static_cast<long>(cur_.nsec)}};
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
      dirs_.push_back({cur_.path, cur_.mode, cur_.sec, cur_.nsec});
      cur_.failed = true;  // no data follows
      return true;
    }
    case Kind::kSymlink: {
      ::unlinkat(parent, cur_.tmp.c_str(), 0);
      if (::symlinkat(link.c_str(), parent, cur_.tmp.c_str()) != 0 ||
          ::renameat(parent, cur_.tmp.c_str(), parent, name.c_str()) != 0) {
        fail_file(classify_errno(errno), errno_reason(errno));
        return true;
      }
      ::utimensat(parent, name.c_str(), times, AT_SYMLINK_NOFOLLOW);
      cur_.failed = true;  // done; no data follows
      return true;
    }
    case Kind::kFile: break;
    default: return false;
  }
  const uint32_t nblocks = block_count(cur_.size);
  cur_.hashes.assign(nblocks, 0);
  cur_.needed.assign(nblocks, true);
  ProbeResult probe;
  bool probed = false;
  {
    std::lock_guard lock(mu_);
    auto it = probes_.find(cur_.id);
    if (it != probes_.end()) {
      probe = std::move(it->second);
      probes_.erase(it);
      probed = true;
    }
  }
  int fd;
  if (probed && probe.keep_final) {
    cur_.keep_final = true;
    fd = ::openat(parent, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  } else {
    // A part file is owner read/write only while it is written: group or
    // other write bits would let another user change bytes after they were
    // verified. Its final mode is set by on_end's fchmod (always: under a
    // default ACL the umask does not decide the created mode).
    cur_.create_mode = 0600;
    fd = -1;
    errno = EEXIST;
    if (!probed) {
      fd = ::openat(parent, cur_.tmp.c_str(),
                    O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, cur_.create_mode);
      cur_.created = fd >= 0;
    }
    if (fd < 0 && errno == EEXIST) {
      const int trunc = probed ? 0 : O_TRUNC;
      fd = ::openat(parent, cur_.tmp.c_str(),
                    O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | trunc, 0600);
    }
  }
  if (fd < 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return true;
  }
  cur_.fd = fd;
  cur_.open = true;
  if (probed) {
    for (uint32_t b = 0; b < nblocks && b < probe.needed.size(); ++b) {
      cur_.needed[b] = probe.needed[b];
      if (!probe.needed[b]) cur_.hashes[b] = probe.hashes[b];
    }
  }
  // A new part file (O_TRUNC) is sized at its end, and only if its last
  // bytes are a hole: most files are written up to their size anyway.
  if (!cur_.keep_final && !cur_.created) {
    if (::ftruncate(fd, static_cast<off_t>(cur_.size)) != 0) {
      fail_file(classify_errno(errno), errno_reason(errno));
      return true;
    }
    if (probed) {
      // Blocks to be re-sent start as holes: the sender sends only data.
      for (uint32_t b = 0; b < nblocks; ++b) {
        if (!cur_.needed[b]) continue;
        const uint64_t off = uint64_t{b} * kBlockSize;
        const uint64_t len = std::min<uint64_t>(kBlockSize, cur_.size - off);
        if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
          static const std::vector<std::byte> zero(kBlockSize);
          int err = 0;
          if (!write_all(fd, zero.data(), len, off, &err)) {
            fail_file(classify_errno(err), errno_reason(err));
            return true;
          }
        }
      }
    }
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
      ::fchmod(cur_.fd, cur_.mode) != 0 || ::futimens(cur_.fd, times) != 0 ||
      ::fsync(cur_.fd) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  if (!cur_.keep_final &&
      ::renameat(cur_.parent, cur_.tmp.c_str(), cur_.parent, cur_.name.c_str()) != 0) {
    fail_file(classify_errno(errno), errno_reason(errno));
    return;
  }
  close_file();
  c_.report->files_done++;
  c_.report->bytes_done += cur_.size;
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

Receiver::Applied Receiver::apply_slot(uint32_t slot, uint32_t* at) {
  const std::byte* mem = c_.slots + uint64_t{slot} * kSlotSize;
  SlotHeader h;
  std::memcpy(&h, mem, sizeof h);
  if (*at > h.payload_len) return Applied::kMalformed;
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
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    const int fd =
        open_beneath(c_.target.base, it->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) continue;
    const timespec times[2] = {{0, UTIME_OMIT}, {it->sec, static_cast<long>(it->nsec)}};
    if (::fchmod(fd, it->mode) != 0 || ::futimens(fd, times) != 0)
      c_.report->error(classify_errno(errno), it->path, errno_reason(errno));
    ::close(fd);
  }
}

void Receiver::writer_loop() {
  uint32_t resume_at = 0;  // where to continue a slot that comes again
  while (true) {
    uint32_t slot = 0, seq = 0;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return abort_ || ready_.contains(next_seq_) ||
               (total_seqs_ >= 0 && next_seq_ == total_seqs_);
      });
      if (abort_) return;
      if (!ready_.contains(next_seq_)) break;  // stream complete
      seq = next_seq_;
      slot = ready_[seq];
      ready_.erase(seq);
    }
    const Applied applied = apply_slot(slot, &resume_at);
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
      Writer nack = message(Msg::kAck);
      nack.put<uint32_t>(slot).put<uint32_t>(seq).put<uint8_t>(0);
      send(nack);
      continue;
    }
    Writer ack = message(Msg::kAck);
    ack.put<uint32_t>(slot).put<uint32_t>(seq).put<uint8_t>(1);
    send(ack);
    std::lock_guard lock(mu_);
    next_seq_++;
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
  std::thread writer([this] { writer_loop(); });
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
      SlotHeader h{};
      if (slot < kSlots) std::memcpy(&h, c_.slots + uint64_t{slot} * kSlotSize, sizeof h);
      if (slot >= kSlots || h.magic != kSlotMagic || h.payload_len > kSlotPayload) {
        fatal(Failure::kPeer, "protocol error: malformed chunk header", true);
        ok = false;
        break;
      }
      const std::byte* payload = c_.slots + uint64_t{slot} * kSlotSize + sizeof h;
      // The records only (no file data): the writer checks the data, once,
      // as it writes it.
      bool parsed = false;
      const uint64_t records =
          records_hash(std::span<const std::byte>(payload, h.payload_len), &parsed);
      if (!parsed || records != h.records_hash) {
        c_.report->chunks_resent++;
        std::fprintf(
            stderr,
            "rdmakit-cp: chunk %u: records failed verification (xxh3); asking again\n",
            h.seq);
        Writer nack = message(Msg::kAck);
        nack.put<uint32_t>(slot).put<uint32_t>(h.seq).put<uint8_t>(0);
        send(nack);
        continue;
      }
      c_.report->chunks++;
      bool in_window = false;
      {
        std::lock_guard lock(mu_);
        // A sender has at most kSlots chunks in flight, from the one the
        // writer waits for on (acks run ahead of next_seq_ by a little): any
        // other sequence number is a lying peer, which could grow ready_.
        in_window = h.seq >= next_seq_ && h.seq - next_seq_ < 2 * kSlots;
        if (in_window) ready_[h.seq] = slot;
        cv_.notify_all();
      }
      if (!in_window) {
        fatal(Failure::kPeer,
              "protocol error: chunk sequence " + std::to_string(h.seq) + " out of order",
              true);
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
      case Msg::kProbe: on_probe(rd); break;
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
  return ok;
}

}  // namespace rdmakit::cp
