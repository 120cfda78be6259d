#include "sender.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "limits.hpp"
#include "records.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

namespace {
// A list message is sent once it is this large (kMaxMessage bounds it).
constexpr size_t kListBatchBytes = 48 * 1024;
}  // namespace

Sender::Sender(SenderConfig config) : c_(std::move(config)), meta_(c_.sync, true) {
  lanes_.push_back(
      {c_.channel, c_.staging, c_.remote_offset, c_.channel->endpoint().peer()});
  for (const SenderLane& l : c_.lanes)
    if (lanes_.size() < kMaxLanes) lanes_.push_back(l);
  nslots_ = static_cast<uint32_t>(lanes_.size()) * kSlots;
}

Sender::~Sender() { stop_threads(); }

void Sender::stop_threads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (lister_.joinable()) lister_.join();
  for (std::thread& t : posters_)
    if (t.joinable()) t.join();
  if (acker_.joinable()) acker_.join();
}

std::byte* Sender::slot_mem(uint32_t s) const {
  return lanes_[s / kSlots].staging.addr + uint64_t{s % kSlots} * kSlotSize;
}

bool Sender::fatal(Failure kind, const std::string& reason) {
  bool was = false;
  if (dead_.compare_exchange_strong(was, true)) c_.report->error(kind, "", reason);
  std::lock_guard lock(mu_);
  cv_.notify_all();
  return false;
}

bool Sender::send_message(Writer& w) {
  if (dead()) return false;
  const session::OpResult r = c_.channel->send(std::span<const std::byte>(w.data()));
  if (!r.ok())
    return fatal(Failure::kPeer, std::string("peer gone: ") + session::errc_name(r.code) +
                                     ": " + r.detail);
  return true;
}

void Sender::file_error(const std::string& path, Failure kind,
                        const std::string& reason) {
  c_.report->error(kind, path, reason);
  Writer w = message(Msg::kFileError);
  w.put<uint8_t>(static_cast<uint8_t>(kind)).str(path).str(reason);
  send_message(w);
}

// The acknowledgement thread: receives every control message until the
// receiver's final report. The peer is silent when something waits for it
// (slots in flight, a probe's answer, the final report) and nothing came
// for c_.timeout.
void Sender::ack_loop() {
  auto heard = std::chrono::steady_clock::now();
  while (!dead()) {
    {
      std::lock_guard lock(mu_);
      if (final_ || stop_) return;
    }
    session::Message m;
    const session::OpResult r = c_.channel->recv(&m, 100ms);
    const auto now = std::chrono::steady_clock::now();
    if (r.code == session::Errc::kTimeout) {
      bool waiting = false;
      {
        std::lock_guard lock(mu_);
        waiting = in_flight_ > 0 || posting_ > 0 || ready_count_ > 0 ||
                  !listed_.empty() ||
                  waiting_since_ != std::chrono::steady_clock::time_point{};
      }
      if (!waiting) {
        heard = now;
      } else if (now - heard > c_.timeout) {
        fatal(Failure::kPeer, "peer silent: no acknowledgement within " +
                                  std::to_string(c_.timeout.count()) + " ms");
        return;
      }
      continue;
    }
    if (!r.ok()) {
      std::string detail = r.detail;
      if (c_.channel->endpoint().closed())
        detail = c_.channel->endpoint().disconnect_info().detail;
      fatal(Failure::kPeer, std::string("peer gone: ") + detail);
      return;
    }
    heard = now;
    if (!handle(m)) return;
  }
}

// Handles one control message (acks, needs, errors, final).
bool Sender::handle(session::Message& m) {
  if (m.is_notification())
    return fatal(Failure::kPeer, "protocol error: unexpected notification");
  Reader rd(m.data());
  const auto type = static_cast<Msg>(rd.get<uint8_t>());
  switch (type) {
    case Msg::kAck: {
      const auto lane = rd.get<uint32_t>();
      const auto in_lane = rd.get<uint32_t>();
      const auto seq = rd.get<uint32_t>();
      const auto ok = rd.get<uint8_t>();
      const uint32_t s =
          lane < lanes_.size() && in_lane < kSlots ? lane * kSlots + in_lane : nslots_;
      std::unique_lock lock(mu_);
      if (!rd.ok() || s >= nslots_ || slots_[s].state != State::kInFlight ||
          slots_[s].seq != seq) {
        lock.unlock();
        return fatal(Failure::kPeer, "protocol error: bad acknowledgement");
      }
      Slot& slot = slots_[s];
      in_flight_--;
      if (ok) {
        slot.state = State::kFree;
        cv_.notify_all();
        return true;
      }
      // The receiver's hash of the chunk did not match: send it again.
      if (++slot.resends > kMaxResends) {
        lock.unlock();
        return fatal(Failure::kVerify, "chunk " + std::to_string(seq) +
                                           " failed verification " +
                                           std::to_string(kMaxResends) + " times");
      }
      if (slot.corrupt_at >= 0) {
        // Restored by the posting thread before it sends the slot again. The
        // bytes were copied out before the receiver could answer, but only
        // through the peer: a write here would race the post in the eyes of
        // this process (and of TSan).
        slot.restore_at = slot.corrupt_at;
        slot.corrupt_at = -1;
      }
      c_.report->chunks_resent++;
      queue_post(s);
      cv_.notify_all();
      return true;
    }
    case Msg::kWant: return on_wants(rd);
    case Msg::kDeleted: return on_deleted(rd);
    case Msg::kListed: {
      const auto deleted = rd.get<uint64_t>();
      if (!rd.ok()) return fatal(Failure::kPeer, "protocol error: bad list end");
      c_.report->files_deleted = deleted;
      std::lock_guard lock(mu_);
      receiver_listed_ = true;
      cv_.notify_all();
      return true;
    }
    case Msg::kFileError: {
      const auto kind = static_cast<Failure>(rd.get<uint8_t>());
      std::string path = rd.str();
      std::string reason = rd.str();
      if (!rd.ok() || kind > Failure::kPeer)
        return fatal(Failure::kPeer, "protocol error: bad file error");
      c_.report->error(kind, std::move(path), "(at the receiver) " + reason);
      return true;
    }
    case Msg::kFinal: {
      // The receiver's count is what arrived and verified.
      const auto files = rd.get<uint64_t>();
      const auto bytes = rd.get<uint64_t>();
      if (rd.ok()) {
        c_.report->files_done = files;
        c_.report->bytes_done = bytes;
      }
      std::lock_guard lock(mu_);
      final_ = true;
      cv_.notify_all();
      return true;
    }
    case Msg::kFatal: {
      const auto kind = static_cast<Failure>(rd.get<uint8_t>());
      const std::string reason = rd.str();
      return fatal(kind > Failure::kPeer ? Failure::kPeer : kind, "receiver: " + reason);
    }
    default:
      return fatal(Failure::kPeer, "protocol error: unexpected message " +
                                       std::to_string(static_cast<int>(type)));
  }
}

void Sender::queue_post(uint32_t s) {
  slots_[s].state = State::kReady;
  Ready& r = ready_[s / kSlots];
  r.ring[r.tail++ % kSlots] = s;
  ready_count_++;
}

// A lane's posting thread: WRITEs its full slots in the order they were
// filled (lanes post in parallel: on tcp each is a connection of its own).
void Sender::post_loop(uint32_t lane) {
  const auto start = std::chrono::steady_clock::now();
  Ready& ready = ready_[lane];
  for (;;) {
    uint32_t s = 0;
    int32_t restore_at = -1;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || dead() || ready.head != ready.tail; });
      if (stop_ || dead()) return;
      s = ready.ring[ready.head++ % kSlots];
      ready_count_--;
      // In flight before the WRITE: its acknowledgement may come at once.
      slots_[s].state = State::kInFlight;
      restore_at = std::exchange(slots_[s].restore_at, -1);
      slots_[s].posting = true;
      in_flight_++;
      posting_++;
    }
    if (restore_at >= 0)
      slot_mem(s)[sizeof(SlotHeader) + static_cast<uint32_t>(restore_at)] ^=
          std::byte{0xff};
    if (c_.bwlimit > 0) {
      // --bwlimit: each slot waits until the bytes before it in the stream
      // (on every lane) fit the rate.
      std::unique_lock lock(mu_);
      const uint64_t before = slots_[s].pace_at;
      const auto due =
          start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(static_cast<double>(before) /
                                                    static_cast<double>(c_.bwlimit)));
      cv_.wait_until(lock, due, [&] { return stop_ || dead(); });
    }
    const bool ok = post(s);
    std::lock_guard lock(mu_);
    slots_[s].posting = false;
    posting_--;
    cv_.notify_all();
    if (!ok) return;
  }
}

bool Sender::acquire() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (dead()) return false;
    // Round robin over the lanes: consecutive slots of the stream go out
    // on consecutive lanes.
    const auto nlanes = static_cast<uint32_t>(lanes_.size());
    for (uint32_t i = 0; i < nslots_; ++i) {
      const uint32_t k = (next_slot_ + i) % nslots_;
      const uint32_t s = (k % nlanes) * kSlots + k / nlanes;
      if (slots_[s].state == State::kFree && !slots_[s].posting) {
        slots_[s].state = State::kFilling;
        next_slot_ = (k + 1) % nslots_;
        cur_ = static_cast<int>(s);
        cur_len_ = 0;
        first_data_ = -1;
        return true;
      }
    }
    cv_.wait(lock);
  }
}

bool Sender::ensure(size_t n) {
  if (cur_ >= 0 && cur_len_ + n <= kSlotPayload) return true;
  if (cur_ >= 0 && !flush()) return false;
  return acquire();
}

void Sender::append(const void* p, size_t n) {
  std::memcpy(slot_mem(static_cast<uint32_t>(cur_)) + sizeof(SlotHeader) + cur_len_, p,
              n);
  cur_len_ += static_cast<uint32_t>(n);
}

bool Sender::post(uint32_t s) {
  {
    std::lock_guard lock(error_mu_);
    if (!post_error_.empty()) return fatal(Failure::kPeer, post_error_);
  }
  const uint32_t l = s / kSlots;
  const SenderLane& ln = lanes_[l];
  const session::Local src{slot_mem(s), kSlotSize, ln.staging.lkey};
  // Errors name the lane and its peer: a lane can die alone.
  const std::string where = lanes_.size() == 1
                                ? std::string()
                                : "lane " + std::to_string(l) + " (" + ln.peer + "): ";
  const session::OpResult r = ln.channel->write_with_imm(
      kSlotsBuffer, ln.remote_offset + uint64_t{s % kSlots} * kSlotSize, src,
      sizeof(SlotHeader) + slots_[s].len, s % kSlots,
      [this, where](const session::OpResult& res) {
        if (res.ok()) return;
        std::lock_guard lock(error_mu_);
        if (post_error_.empty())
          post_error_ = where + "chunk WRITE failed: " + res.detail;
      });
  if (!r.ok())
    return fatal(Failure::kPeer, where + "chunk WRITE failed: " +
                                     session::errc_name(r.code) + ": " + r.detail);
  return true;
}

bool Sender::flush() {
  if (cur_ < 0) return !dead();
  const auto s = static_cast<uint32_t>(cur_);
  cur_ = -1;
  std::byte* mem = slot_mem(s);
  if (cur_len_ == 0) {
    std::lock_guard lock(mu_);
    slots_[s].state = State::kFree;
    return !dead();
  }
  bool parsed = false;
  const uint64_t records = records_hash(
      std::span<const std::byte>(mem + sizeof(SlotHeader), cur_len_), &parsed);
  if (!parsed)
    return fatal(Failure::kPeer, "internal error: a slot's records do not parse");
  const uint32_t seq = next_seq_++;
  SlotHeader h{kSlotMagic, seq, cur_len_, 0, records, 0};
  std::memcpy(mem, &h, sizeof h);
  int32_t corrupt_at = -1;
  if (c_.corrupt_chunk >= 0 && static_cast<int64_t>(chunks_posted_) == c_.corrupt_chunk) {
    // Fault injection: the chunk changes after its hashes were taken, as if
    // corrupted in flight; the receiver must nack it and get it again. A
    // file data byte (caught by its block digest) if the chunk has data and
    // records were not asked for, else the first record byte (the slot hash).
    corrupt_at = c_.corrupt_records || first_data_ < 0 ? 0 : first_data_;
    mem[sizeof(SlotHeader) + static_cast<uint32_t>(corrupt_at)] ^= std::byte{0xff};
  }
  chunks_posted_++;
  c_.report->chunks++;
  std::lock_guard lock(mu_);
  slots_[s] = Slot{State::kFilling, seq, cur_len_, 0, corrupt_at};
  slots_[s].pace_at = paced_bytes_;
  paced_bytes_ += cur_len_;
  queue_post(s);
  cv_.notify_all();
  return !dead();
}

// The receiver's answers, in the order of the list: kept until the reading
// thread acts on them. Each must answer the next listed entry.
bool Sender::on_wants(Reader& rd) {
  const auto n = rd.get<uint32_t>();
  if (!rd.ok() || n == 0) return fatal(Failure::kPeer, "protocol error: bad answers");
  std::vector<Answer> got;
  for (uint32_t i = 0; i < n; ++i) {
    Answer a;
    a.id = rd.get<uint32_t>();
    a.want = static_cast<Want>(rd.get<uint8_t>());
    a.items = rd.get<uint16_t>();
    if (a.want == Want::kDelta) {
      a.basis = rd.get<uint8_t>();
      const auto blocks = rd.get<uint32_t>();
      if (!rd.ok() || blocks > rd.left() / sizeof(uint64_t) ||
          (a.basis != kEntryBasisFinal && a.basis != kEntryBasisPart))
        return fatal(Failure::kPeer, "protocol error: bad delta answer");
      const auto raw = rd.take(uint64_t{blocks} * sizeof(uint64_t));
      a.hashes.resize(blocks);
      if (!raw.empty()) std::memcpy(a.hashes.data(), raw.data(), raw.size());
    }
    if (!rd.ok() || a.want > Want::kDelta || (a.items & ~kItemKnown) != 0)
      return fatal(Failure::kPeer, "protocol error: bad answer");
    got.push_back(std::move(a));
  }
  std::unique_lock lock(mu_);
  for (Answer& a : got) {
    // Answers come in list order, one per listed entry: anything else is a
    // lying peer (and could grow answers_ without bound).
    if (a.id != answered_ids_ + 1 || answered_ids_ + 1 > listed_ids_) {
      lock.unlock();
      return fatal(Failure::kPeer, "protocol error: an answer for an entry not listed");
    }
    answered_ids_ = a.id;
    answers_.push_back(std::move(a));
  }
  cv_.notify_all();
  return true;
}

bool Sender::on_deleted(Reader& rd) {
  const auto n = rd.get<uint32_t>();
  for (uint32_t i = 0; i < n && rd.ok(); ++i) {
    const bool is_dir = rd.get<uint8_t>() != 0;
    const std::string path = rd.str(kMaxPath);
    if (rd.ok())
      c_.report->item(deleting_line(path, is_dir),
                      "deleting " + path + (is_dir ? "/" : ""));
  }
  if (!rd.ok()) return fatal(Failure::kPeer, "protocol error: bad deletion list");
  return true;
}

// What the list says of an entry: its metadata as the walk saw it, its
// owner and attributes when kept, and under -H whether it is a link to an
// earlier entry; under --checksum its content hash (one read of the file).
bool Sender::describe(const Entry& e, uint32_t id, Listed* out) {
  EntryRecord& rec = out->rec;
  rec.id = id;
  rec.kind = static_cast<uint8_t>(e.kind);
  rec.mode = e.mode;
  rec.sec = e.mtime_sec;
  rec.nsec = e.mtime_nsec;
  rec.size = e.kind == Kind::kFile ? e.size : 0;
  rec.path = e.rel;
  rec.link = e.link;
  if ((c_.sync & kSyncHardLinks) && e.kind == Kind::kFile && e.nlink > 1) {
    auto [it, first] = first_links_.try_emplace({e.dev, e.ino}, e.rel);
    if (!first) {
      rec.kind = static_cast<uint8_t>(Kind::kHardlink);
      rec.link = it->second;
    }
  }
  if (!c_.test_top.empty()) {
    const size_t slash = rec.path.find('/');
    rec.path = c_.test_top + (slash == std::string::npos ? "" : rec.path.substr(slash));
  }
  if (!c_.test_link.empty() && e.kind == Kind::kFile) {
    rec.kind = static_cast<uint8_t>(Kind::kHardlink);
    rec.link = std::exchange(c_.test_link, "");
  }
  const std::string why = meta_.describe(e, c_.root, &rec);
  if (!why.empty()) c_.report->error(Failure::kFile, e.open, why);
  if ((c_.sync & kSyncChecksum) && rec.kind == static_cast<uint8_t>(Kind::kFile)) {
    const int fd = open_source(c_.root, e.open);
    if (fd < 0) {
      c_.report->error(classify_errno(-fd), e.open, std::strerror(-fd));
      return false;
    }
    bool io_error = false;
    out->hashes = block_hashes(fd, e.size, &io_error);
    ::close(fd);
    if (io_error) {
      c_.report->error(Failure::kFile, e.open, "read error while hashing");
      return false;
    }
    rec.flags |= kEntryChecksum;
    rec.checksum = file_hash(out->hashes);
  }
  out->entry = e;
  return true;
}

// The lister thread: lists entries as the walk finds them, a batch per
// message, at most kListWindow ahead of the receiver's answers.
void Sender::list_loop(EntryQueue* queue) {
  Writer batch;
  uint32_t count = 0;
  uint32_t id = 0;
  auto send_batch = [&] {
    if (count == 0) return true;
    std::memcpy(batch.data().data() + 1, &count, sizeof count);
    count = 0;
    return send_message(batch);
  };
  bool totals_sent = false;
  auto send_totals = [&] {
    totals_sent = true;
    c_.report->total_files = queue->files();
    c_.report->total_bytes = queue->bytes();
    Writer totals = message(Msg::kTotals);
    totals.put<uint64_t>(queue->files()).put<uint64_t>(queue->bytes());
    return send_message(totals);
  };
  std::vector<Entry> got;
  for (;;) {
    // As soon as the walk is done (at once when it ran before, as a pull's).
    if (!totals_sent && queue->walk_done() && !send_totals()) return;
    // Batches of the walk's entries; when the walk is behind, what is
    // listed goes out so that the receiver can answer it meanwhile.
    if (!queue->take_batch(&got, std::chrono::milliseconds(2))) break;
    if (got.empty() && !send_batch()) return;
    for (const Entry& e : got) {
      {
        std::unique_lock lock(mu_);
        if (listed_.size() >= kListWindow) {
          // Down to half the window before listing on: a batch per answer
          // would cost a message per entry.
          lock.unlock();
          if (!send_batch()) return;
          lock.lock();
          cv_.wait(lock,
                   [&] { return stop_ || dead() || listed_.size() <= kListWindow / 2; });
        }
        if (stop_ || dead()) return;
      }
      Listed l;
      if (!describe(e, id + 1, &l)) continue;
      ++id;
      Writer one;
      encode_entry(l.rec, &one);
      // A batch stays within one message.
      if (count > 0 && batch.data().size() + one.data().size() > kMaxMessage - 64 &&
          !send_batch())
        return;
      if (count == 0) {
        batch = message(Msg::kCheck);
        batch.put<uint32_t>(0);  // the count, patched when sent
      }
      batch.bytes(one.data());
      ++count;
      c_.report->files_listed++;
      if (l.rec.kind == static_cast<uint8_t>(Kind::kDir)) c_.report->dirs_listed++;
      if (l.rec.kind == static_cast<uint8_t>(Kind::kSymlink)) c_.report->links_listed++;
      c_.report->bytes_listed += l.rec.size;
      {
        std::lock_guard lock(mu_);
        listed_.push_back(std::move(l));
        listed_ids_ = id;
      }
      if (batch.data().size() >= kListBatchBytes && !send_batch()) return;
    }
    got.clear();
  }
  if (!send_batch() || (!totals_sent && !send_totals())) return;
  Writer end = message(Msg::kListEnd);
  if (!send_message(end)) return;
  std::lock_guard lock(mu_);
  list_done_ = true;
  waiting_since_ = std::chrono::steady_clock::now();
  cv_.notify_all();
}

bool Sender::send_record(const EntryRecord& rec) {
  Writer w;
  w.put<uint8_t>(static_cast<uint8_t>(Rec::kEntry));
  encode_entry(rec, &w);
  if (!ensure(w.data().size())) return false;
  append(w.data().data(), w.data().size());
  return true;
}

bool Sender::send_file(Listed& l, const Answer* delta) {
  const Entry& entry = l.entry;
  const int fd = open_source(c_.root, entry.open);
  if (fd < 0) {
    file_error(entry.open, classify_errno(-fd), std::strerror(-fd));
    return !dead_;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    file_error(entry.open, Failure::kFile,
               "changed while being copied (not a regular file)");
    ::close(fd);
    return !dead_;
  }
  // Metadata as of opening.
  EntryRecord rec = l.rec;
  rec.flags &= static_cast<uint8_t>(~kEntryChecksum);
  rec.size = static_cast<uint64_t>(st.st_size);
  rec.mode = st.st_mode & 07777;
  rec.sec = st.st_mtim.tv_sec;
  rec.nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
  const uint64_t size = rec.size;
  const uint32_t nblocks = block_count(size);
  std::vector<uint64_t> hashes(nblocks, 0);
  std::vector<bool> needed(nblocks, true);

  if (delta != nullptr) {
    // Only the blocks whose hashes differ from the basis's are sent; the
    // receiver takes the others from the basis.
    // The hashes --checksum read, unless the file changed since.
    const bool same = l.hashes.size() == nblocks && size == l.entry.size &&
                      rec.sec == l.entry.mtime_sec && rec.nsec == l.entry.mtime_nsec;
    bool io_error = false;
    hashes = same ? l.hashes : block_hashes(fd, size, &io_error);
    for (uint32_t b = 0; b < nblocks && !io_error; ++b) {
      if (b < delta->hashes.size() && hashes[b] == delta->hashes[b]) {
        needed[b] = false;
        c_.report->bytes_matched +=
            std::min<uint64_t>(kBlockSize, size - uint64_t{b} * kBlockSize);
      }
    }
    if (io_error) {
      file_error(entry.open, Failure::kFile, "read error while hashing");
      ::close(fd);
      return !dead_;
    }
    rec.flags |= delta->basis;
    rec.sent = needed;
  }
  if (c_.lie_size) rec.size = c_.declare_size;
  c_.report->file_started(rec.path, size);
  if (!send_record(rec)) {
    ::close(fd);
    return false;
  }
  const uint32_t id = rec.id;
  const uint64_t file_size = size;
  BlockHasher hasher;
  std::string failure;
  uint64_t ext_start = 0, ext_end = 0;  // current data extent [start, end)
  if (static_cast<uint64_t>(st.st_blocks) * 512 >= file_size) {
    // Allocated blocks cover the size: no hole to keep, no extent lookups
    // (two system calls per file that dominate with small files).
    ext_end = file_size;
  }
  for (uint32_t b = 0; b < nblocks && failure.empty(); ++b) {
    if (!needed[b]) continue;  // hashes[b] is the basis's
    const uint64_t end = std::min<uint64_t>(uint64_t{b + 1} * kBlockSize, file_size);
    uint64_t pos = uint64_t{b} * kBlockSize;
    while (pos < end) {
      if (pos >= ext_end) {
        // Next data extent. SEEK_HOLE scans the extent (tmpfs walks its
        // pages), so each extent is looked up once, not once per block.
        const off_t d = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
        if (d < 0) {
          ext_start = ext_end = file_size;  // ENXIO: only a hole is left
        } else {
          const off_t h = ::lseek(fd, d, SEEK_HOLE);
          ext_start = static_cast<uint64_t>(d);
          ext_end =
              h < 0 ? file_size : std::min<uint64_t>(static_cast<uint64_t>(h), file_size);
          if (ext_end <= ext_start) ext_end = ext_start = file_size;
        }
      }
      if (ext_start >= end) break;  // the rest of the block is a hole
      const uint64_t seg_end = std::min(ext_end, end);
      uint64_t off = std::max(pos, ext_start);
      while (off < seg_end) {
        if (!ensure(kDataHeader + 4096)) {
          ::close(fd);
          return false;
        }
        const uint32_t room =
            kSlotPayload - cur_len_ - static_cast<uint32_t>(kDataHeader);
        const auto len = static_cast<uint32_t>(std::min<uint64_t>(room, seg_end - off));
        std::byte* dst = slot_mem(static_cast<uint32_t>(cur_)) + sizeof(SlotHeader) +
                         cur_len_ + kDataHeader;
        ssize_t got = 0;
        while (got < len) {
          const ssize_t n =
              ::pread(fd, dst + got, len - got, static_cast<off_t>(off + got));
          if (n <= 0) break;
          got += n;
        }
        if (got != len) {
          failure = got < 0 ? std::strerror(errno) : "file shrank while being copied";
          break;
        }
        // One pass over the bytes, while they are in the cache: the block's
        // running digest goes into the record, the block hash is its end.
        if (!hasher.active()) hasher.start(b, file_size);
        hasher.data(off, std::span<const std::byte>(dst, len));
        put<uint8_t>(static_cast<uint8_t>(Rec::kData));
        put<uint32_t>(id);
        put<uint64_t>(off);
        put<uint32_t>(len);
        put<uint64_t>(hasher.digest());
        if (first_data_ < 0) first_data_ = static_cast<int32_t>(cur_len_);
        cur_len_ += len;
        c_.report->bytes_sent += len;
        off += len;
      }
      if (!failure.empty()) break;
      pos = seg_end;
    }
    hashes[b] = hasher.finish();
  }
  ::close(fd);
  if (!failure.empty()) {
    Writer w;
    w.put<uint8_t>(static_cast<uint8_t>(Rec::kAbort)).put<uint32_t>(id).str(failure);
    if (!ensure(w.data().size())) return false;
    append(w.data().data(), w.data().size());
    c_.report->error(Failure::kFile, entry.open, failure);
    return true;
  }
  if (!ensure(16)) return false;
  put<uint8_t>(static_cast<uint8_t>(Rec::kEnd));
  put<uint32_t>(id);
  put<uint64_t>(file_hash(hashes));
  c_.report->files_done++;
  c_.report->bytes_done += file_size;
  c_.report->files_transferred++;
  c_.report->bytes_transferred += file_size;
  c_.report->file_finished();
  return true;
}

bool Sender::run(EntryQueue& queue) {
  acker_ = std::thread([this] { ack_loop(); });
  for (uint32_t l = 0; l < lanes_.size(); ++l)
    posters_.emplace_back([this, l] { post_loop(l); });
  lister_ = std::thread([this, &queue] { list_loop(&queue); });
  for (;;) {
    Listed l;
    Answer a;
    {
      std::unique_lock lock(mu_);
      // Nothing to act on: let the receiver work on what is pending first.
      if (answers_.empty() && cur_ >= 0) {
        lock.unlock();
        if (!flush()) return false;
        lock.lock();
      }
      cv_.wait(lock, [&] {
        return dead() || !answers_.empty() || (list_done_ && listed_.empty());
      });
      if (dead()) return false;
      if (answers_.empty()) break;
      a = std::move(answers_.front());
      answers_.pop_front();
      l = std::move(listed_.front());
      listed_.pop_front();
      if (listed_.size() == kListWindow / 2) cv_.notify_all();  // the lister lists on
    }
    const auto kind = static_cast<Kind>(l.rec.kind);
    c_.report->entries_answered++;
    if (kind == Kind::kFile && (a.items & kItemNew)) c_.report->files_created++;
    if (kind == Kind::kFile && a.want == Want::kSkip)
      c_.report->bytes_skipped += l.rec.size;
    if (a.items != 0)
      c_.report->item(item_line(c_.side, kind, a.items, l.rec.path, l.rec.link),
                      l.rec.path + (kind == Kind::kDir ? "/" : ""));
    bool ok = true;
    switch (a.want) {
      case Want::kSkip:
        if (kind == Kind::kFile) c_.report->files_skipped++;
        break;
      case Want::kSend:
        ok = kind == Kind::kFile ? send_file(l, nullptr) : send_record(l.rec);
        break;
      case Want::kDelta:
        ok = kind == Kind::kFile
                 ? send_file(l, &a)
                 : fatal(Failure::kPeer, "protocol error: delta of a non-file");
        break;
    }
    if (!ok) return false;
  }
  if (!flush()) return false;
  {
    // Deletions (and with them the receiver's generator) end before the
    // stream does.
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return dead() || receiver_listed_; });
    if (dead()) return false;
  }
  Writer done = message(Msg::kDone);
  done.put<uint32_t>(next_seq_);
  {
    std::lock_guard lock(mu_);
    waiting_since_ = std::chrono::steady_clock::now();
  }
  if (!send_message(done)) return false;
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return dead() || final_; });
  return final_ && !dead();
}

}  // namespace rdmakit::cp
