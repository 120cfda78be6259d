// The receiver's answer to a --resume probe: which blocks of a file it
// already holds (under the final name or in a part file), checked against
// the sender's block hashes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "confine.hpp"
#include "limits.hpp"
#include "receiver.hpp"
#include "records.hpp"

namespace rdmakit::cp {

void Receiver::on_probe(Reader& rd) {
  ProbeRecord probe;
  if (parse_probe(rd, &probe) != Parsed::kOk) {
    fatal(Failure::kPeer, "protocol error: malformed probe (or a size over the limit)",
          true);
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (probes_.size() >= kSlots * 4) {  // probes are answered one at a time
      fatal(Failure::kPeer, "protocol error: too many probes", true);
      return;
    }
  }
  const uint32_t id = probe.id;
  const std::string& rel = probe.path;
  const uint64_t size = probe.size;
  const auto nblocks = static_cast<uint32_t>(probe.hashes.size());
  std::vector<uint64_t> theirs = std::move(probe.hashes);
  ProbeResult res;
  res.needed.assign(nblocks, true);
  NeedMode mode = NeedMode::kAll;
  std::string why;
  const std::string path = map_path(rel, &why);
  int parent = -1;
  if (!path.empty()) {
    auto [dir, name] = split_parent(path);
    parent = dir == "." ? ::dup(c_.target.base)
                        : open_beneath(c_.target.base, dir, O_PATH | O_DIRECTORY);
    std::vector<std::byte> scratch;
    auto compare = [&](int fd, uint64_t have) {
      bool io_error = false;
      uint32_t matched = 0;
      for (uint32_t b = 0; b < nblocks; ++b) {
        if (uint64_t{b} * kBlockSize >= have) break;
        if (hash_file_block(fd, have, b, &scratch, &io_error) == theirs[b] && !io_error) {
          res.needed[b] = false;
          ++matched;
        }
      }
      return matched;
    };
    struct stat st {};
    if (parent >= 0) {
      const int fin = ::openat(parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fin >= 0 && ::fstat(fin, &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<uint64_t>(st.st_size) == size && compare(fin, size) == nblocks) {
        mode = NeedMode::kNone;
        res.keep_final = true;
      } else {
        res.needed.assign(nblocks, true);
        const int part =
            ::openat(parent, part_name(name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (part >= 0 && ::fstat(part, &st) == 0 && S_ISREG(st.st_mode)) {
          // The last block only matches if the part file had the same size.
          const uint64_t have =
              std::min<uint64_t>(static_cast<uint64_t>(st.st_size), size);
          compare(part, have);
          if (have < size && nblocks > 0 && have / kBlockSize < nblocks)
            res.needed[have / kBlockSize] = true;
          mode = NeedMode::kBitmap;
        }
        if (part >= 0) ::close(part);
      }
      if (fin >= 0) ::close(fin);
      ::close(parent);
    }
  }
  res.hashes = std::move(theirs);
  Writer w = message(Msg::kNeed);
  w.put<uint32_t>(id).put<uint8_t>(static_cast<uint8_t>(mode));
  if (mode == NeedMode::kBitmap) {
    std::vector<std::byte> bits((nblocks + 7) / 8);
    for (uint32_t b = 0; b < nblocks; ++b)
      if (res.needed[b]) bits[b / 8] |= std::byte{static_cast<uint8_t>(1u << (b % 8))};
    w.bytes(bits);
  }
  if (mode != NeedMode::kAll) {
    std::lock_guard lock(mu_);
    probes_[id] = std::move(res);
  }
  if (mode == NeedMode::kNone) c_.report->files_skipped++;
  send(w);
}

}  // namespace rdmakit::cp
