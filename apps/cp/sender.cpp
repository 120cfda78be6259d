#include "sender.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "records.hpp"

namespace rdmakit::cp {

using namespace std::chrono_literals;

Sender::Sender(SenderConfig config) : c_(config) {}

Sender::~Sender() { stop_threads(); }

void Sender::stop_threads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (poster_.joinable()) poster_.join();
  if (acker_.joinable()) acker_.join();
}

std::byte* Sender::slot_mem(uint32_t s) const {
  return c_.staging.addr + uint64_t{s} * kSlotSize;
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
        waiting = in_flight_ > 0 || posting_ > 0 || ready_head_ != ready_tail_ ||
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
      const auto s = rd.get<uint32_t>();
      const auto seq = rd.get<uint32_t>();
      const auto ok = rd.get<uint8_t>();
      std::unique_lock lock(mu_);
      if (!rd.ok() || s >= kSlots || slots_[s].state != State::kInFlight ||
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
    case Msg::kNeed: {
      const auto id = rd.get<uint32_t>();
      if (!rd.ok()) return fatal(Failure::kPeer, "protocol error: bad need");
      auto rest = rd.take(rd.left());
      std::unique_lock lock(mu_);
      // Only the answer to the probe waited for is kept (a peer could
      // otherwise grow needs_ without bound).
      if (id != awaiting_need_ || needs_.contains(id)) {
        lock.unlock();
        return fatal(Failure::kPeer, "protocol error: unexpected need");
      }
      needs_[id].assign(rest.begin(), rest.end());
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
  ready_[ready_tail_++ % kSlots] = s;
}

// The posting thread: WRITEs full slots in the order they were filled.
void Sender::post_loop() {
  for (;;) {
    uint32_t s = 0;
    int32_t restore_at = -1;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || dead() || ready_head_ != ready_tail_; });
      if (stop_ || dead()) return;
      s = ready_[ready_head_++ % kSlots];
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
    const bool ok = post(s);
    std::lock_guard lock(mu_);
    slots_[s].posting = false;
    posting_--;
    cv_.notify_all();
    if (!ok) return;
  }
}

bool Sender::wait_posted() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return dead() || (ready_head_ == ready_tail_ && posting_ == 0); });
  return !dead();
}

bool Sender::acquire() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (dead()) return false;
    for (uint32_t i = 0; i < kSlots; ++i) {
      const uint32_t s = (next_slot_ + i) % kSlots;
      if (slots_[s].state == State::kFree && !slots_[s].posting) {
        slots_[s].state = State::kFilling;
        next_slot_ = (s + 1) % kSlots;
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

void Sender::put_str(const std::string& s) {
  put<uint32_t>(static_cast<uint32_t>(s.size()));
  append(s.data(), s.size());
}

bool Sender::post(uint32_t s) {
  {
    std::lock_guard lock(error_mu_);
    if (!post_error_.empty()) return fatal(Failure::kPeer, post_error_);
  }
  const session::Local src{slot_mem(s), kSlotSize, c_.staging.lkey};
  const session::OpResult r = c_.channel->write_with_imm(
      kSlotsBuffer, c_.remote_offset + uint64_t{s} * kSlotSize, src,
      sizeof(SlotHeader) + slots_[s].len, s, [this](const session::OpResult& res) {
        if (res.ok()) return;
        std::lock_guard lock(error_mu_);
        if (post_error_.empty()) post_error_ = "chunk WRITE failed: " + res.detail;
      });
  if (!r.ok())
    return fatal(Failure::kPeer, std::string("chunk WRITE failed: ") +
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
  queue_post(s);
  cv_.notify_all();
  return !dead();
}

bool Sender::send_entry(const Entry& e, uint32_t id) {
  if (!ensure(64 + e.rel.size() + e.link.size())) return false;
  put<uint8_t>(static_cast<uint8_t>(Rec::kEntry));
  put<uint32_t>(id);
  put<uint8_t>(static_cast<uint8_t>(e.kind));
  put<uint32_t>(e.mode);
  put<int64_t>(e.mtime_sec);
  put<uint32_t>(e.mtime_nsec);
  put<uint64_t>(e.kind == Kind::kFile && c_.lie_size ? c_.declare_size : e.size);
  put_str(e.rel);
  put_str(e.link);
  return true;
}

bool Sender::send_file(const Entry& entry, uint32_t id) {
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
  Entry e = entry;  // metadata as of opening
  e.size = static_cast<uint64_t>(st.st_size);
  e.mode = st.st_mode & 07777;
  e.mtime_sec = st.st_mtim.tv_sec;
  e.mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
  const uint32_t nblocks = block_count(e.size);
  std::vector<uint64_t> hashes(nblocks, 0);
  std::vector<bool> needed(nblocks, true);

  if (c_.resume && nblocks > 0 &&
      nblocks * sizeof(uint64_t) + 256 + e.rel.size() < kMaxMessage) {
    std::vector<std::byte> scratch;
    bool io_error = false;
    for (uint32_t b = 0; b < nblocks; ++b)
      hashes[b] = hash_file_block(fd, e.size, b, &scratch, &io_error);
    if (io_error) {
      file_error(entry.open, Failure::kFile, "read error while hashing");
      ::close(fd);
      return !dead_;
    }
    Writer w = message(Msg::kProbe);
    w.put<uint32_t>(id).str(e.rel).put<uint64_t>(e.size).put<uint32_t>(nblocks);
    w.bytes(std::as_bytes(std::span(hashes)));
    // The probe names a file the receiver may not have seen yet: flush what
    // is pending so directories exist first.
    if (!flush() || !wait_posted()) {
      ::close(fd);
      return false;
    }
    std::vector<std::byte> need;
    {
      std::unique_lock lock(mu_);
      waiting_since_ = std::chrono::steady_clock::now();
      awaiting_need_ = id;
      lock.unlock();
      const bool sent = send_message(w);
      lock.lock();
      if (sent) cv_.wait(lock, [&] { return dead() || needs_.contains(id); });
      waiting_since_ = {};
      if (!sent || dead()) {
        ::close(fd);
        return false;
      }
      need = std::move(needs_[id]);
      needs_.erase(id);
    }
    Reader rd(need);
    const auto mode = static_cast<NeedMode>(rd.get<uint8_t>());
    if (mode == NeedMode::kNone) {
      std::fill(needed.begin(), needed.end(), false);
      c_.report->files_skipped++;
    } else if (mode == NeedMode::kBitmap) {
      auto bits = rd.take((nblocks + 7) / 8);
      if (!rd.ok()) {
        ::close(fd);
        return fatal(Failure::kPeer, "protocol error: short bitmap");
      }
      for (uint32_t b = 0; b < nblocks; ++b)
        needed[b] = (std::to_integer<uint8_t>(bits[b / 8]) >> (b % 8)) & 1;
    }
  }

  if (!send_entry(e, id)) {
    ::close(fd);
    return false;
  }
  BlockHasher hasher;
  std::string failure;
  uint64_t ext_start = 0, ext_end = 0;  // current data extent [start, end)
  if (static_cast<uint64_t>(st.st_blocks) * 512 >= e.size) {
    // Allocated blocks cover the size: no hole to keep, no extent lookups
    // (two system calls per file that dominate with small files).
    ext_end = e.size;
  }
  for (uint32_t b = 0; b < nblocks && failure.empty(); ++b) {
    if (!needed[b]) continue;  // hashes[b] came from the probe
    const uint64_t end = std::min<uint64_t>(uint64_t{b + 1} * kBlockSize, e.size);
    uint64_t pos = uint64_t{b} * kBlockSize;
    while (pos < end) {
      if (pos >= ext_end) {
        // Next data extent. SEEK_HOLE scans the extent (tmpfs walks its
        // pages), so each extent is looked up once, not once per block.
        const off_t d = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
        if (d < 0) {
          ext_start = ext_end = e.size;  // ENXIO: only a hole is left
        } else {
          const off_t h = ::lseek(fd, d, SEEK_HOLE);
          ext_start = static_cast<uint64_t>(d);
          ext_end = h < 0 ? e.size : std::min<uint64_t>(static_cast<uint64_t>(h), e.size);
          if (ext_end <= ext_start) ext_end = ext_start = e.size;
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
        if (!hasher.active()) hasher.start(b, e.size);
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
    if (!ensure(64 + failure.size())) return false;
    put<uint8_t>(static_cast<uint8_t>(Rec::kAbort));
    put<uint32_t>(id);
    put_str(failure);
    c_.report->error(Failure::kFile, entry.open, failure);
    return true;
  }
  if (!ensure(16)) return false;
  put<uint8_t>(static_cast<uint8_t>(Rec::kEnd));
  put<uint32_t>(id);
  put<uint64_t>(file_hash(hashes));
  c_.report->files_done++;
  c_.report->bytes_done += e.size;
  return true;
}

bool Sender::run(EntryQueue& queue) {
  // Totals (for the receiver's progress display) go out once the walk is
  // complete; entries are sent as the walk finds them.
  bool totals_sent = false;
  auto send_totals = [&] {
    totals_sent = true;
    c_.report->total_files = queue.files();
    c_.report->total_bytes = queue.bytes();
    Writer totals = message(Msg::kTotals);
    totals.put<uint64_t>(queue.files()).put<uint64_t>(queue.bytes());
    return send_message(totals);
  };
  acker_ = std::thread([this] { ack_loop(); });
  poster_ = std::thread([this] { post_loop(); });
  std::vector<Entry> batch;
  uint32_t id = 0;
  for (;;) {
    // As soon as the walk is done (at once when it ran before, as a pull's).
    if (!totals_sent && queue.walk_done() && !send_totals()) return false;
    if (!queue.take(&batch, false)) break;
    if (batch.empty()) {
      // The walk is behind: let the receiver work on what is pending.
      if (!flush()) return false;
      if (!queue.take(&batch, true)) break;
    }
    for (const Entry& e : batch) {
      ++id;
      const bool ok = e.kind == Kind::kFile ? send_file(e, id) : send_entry(e, id);
      if (!ok) return false;
    }
    batch.clear();
  }
  if (!totals_sent && !send_totals()) return false;
  if (!flush()) return false;
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
