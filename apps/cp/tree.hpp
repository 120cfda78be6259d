#pragma once
// The source side's view of a tree: walking sources into entries (files,
// directories, symlinks with mode and mtime; never following a symlink) and
// the content hashes both ends compute identically.
//
// Hashes (xxh3-64): a file is cut into kBlockSize blocks. A block that is all
// hole hashes to 0; any other block hashes its logical bytes (holes as
// zeros). The file hash is the xxh3 of the array of block hashes, so it can
// be computed from received blocks and from blocks kept by --resume alike.
// The running digest of a block (the xxh3 of its bytes so far) is what a data
// record carries on the wire, so one pass over the bytes checks the transfer
// and yields the block hash (records.hpp).
#include <dirent.h>
#include <xxhash.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "protocol.hpp"
#include "report.hpp"

namespace rdmakit::cp {

struct Entry {
  Kind kind = Kind::kFile;
  std::string rel;   // path on the wire: first component = source's name
  std::string open;  // path to open on this side (beneath the base fd)
  uint32_t mode = 0;
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
  uint64_t size = 0;
  std::string link;  // symlink target
  uint32_t uid = 0, gid = 0;
  uint64_t dev = 0, ino = 0;
  uint32_t nlink = 0;
  bool stated = false;  // the fields above come from a stat of the walk
};

// Where sources are opened: beneath `base` (the server's root, confined) or
// from the current directory (the client's own files).
struct SourceRoot {
  int base;       // dir fd or AT_FDCWD
  bool confined;  // open_beneath (peer-named paths) vs plain openat
};

class EntryQueue;

// What a walk leaves out: an entry for which `excluded(wire path, is_dir)`
// is true is not listed, and an excluded directory is not entered (as
// rsync's filter rules).
struct WalkOptions {
  bool recursive = false;
  std::function<bool(const std::string&, bool)> excluded;
};

// Pushes the entries of `source` (pre-order, names sorted), each stat'ed.
// Errors (missing, permission, escape, directory without -r) go to
// `report`. Returns false if the queue was cancelled.
bool walk_source(const SourceRoot& root, const std::string& source,
                 const WalkOptions& options, EntryQueue* out, Report* report);

// Opens a path on the source side (read-only, not following a final symlink).
int open_source(const SourceRoot& root, const std::string& path);

inline uint32_t block_count(uint64_t size) {
  return static_cast<uint32_t>((size + kBlockSize - 1) / kBlockSize);
}

// Streams one block's logical content: data at increasing offsets, gaps as
// zeros. Blocks with no data at all hash to 0.
class BlockHasher {
 public:
  BlockHasher();
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;
  void start(uint32_t block, uint64_t file_size);
  void data(uint64_t offset, std::span<const std::byte> bytes);
  uint64_t finish();
  // xxh3 of the block's bytes so far (holes as zeros), without ending it.
  uint64_t digest() const;
  // Remembers the state, to go back to it when the data that follows fails
  // its check (it will come again).
  void checkpoint();
  void rollback();
  bool active() const { return active_; }
  uint32_t block() const { return block_; }

 private:
  void zeros(uint64_t n);
  XXH3_state_t* state_;
  XXH3_state_t* saved_;
  uint64_t saved_pos_ = 0;
  bool active_ = false;
  uint32_t block_ = 0;
  uint64_t pos_ = 0;
  uint64_t end_ = 0;
};

// Hash of block b of an open file as it is on disk (for --resume).
uint64_t hash_file_block(int fd, uint64_t size, uint32_t b,
                         std::vector<std::byte>* scratch, bool* io_error);
// Every block's hash of an open file of `size` (a delta's basis, a source
// under --checksum). *io_error on a read error.
std::vector<uint64_t> block_hashes(int fd, uint64_t size, bool* io_error);
uint64_t file_hash(const std::vector<uint64_t>& block_hashes);
// The names in an open directory stream, without "." and "..", sorted.
std::vector<std::string> sorted_names(DIR* dir);
// The name a source is copied under: its last component.
std::string source_name(const std::string& source);

}  // namespace rdmakit::cp
