#include "tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "confine.hpp"
#include "entry_queue.hpp"

namespace rdmakit::cp {

std::vector<std::string> sorted_names(DIR* dir) {
  std::vector<std::string> names;
  while (dirent* d = ::readdir(dir))
    if (std::strcmp(d->d_name, ".") != 0 && std::strcmp(d->d_name, "..") != 0)
      names.emplace_back(d->d_name);
  std::sort(names.begin(), names.end());
  return names;
}

std::string source_name(const std::string& source) {
  std::string s = source;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

namespace {

int open_at(const SourceRoot& root, const std::string& path, int flags) {
  if (root.confined) {
    const std::string why = check_relative(path);
    if (!why.empty()) return -EXDEV;
    return open_beneath(root.base, path, flags);
  }
  const int fd = ::openat(root.base, path.c_str(), flags | O_CLOEXEC);
  return fd >= 0 ? fd : -errno;
}

void fill_meta(const struct stat& st, Entry* e) {
  e->mode = st.st_mode & 07777;
  e->mtime_sec = st.st_mtim.tv_sec;
  e->mtime_nsec = static_cast<uint32_t>(st.st_mtim.tv_nsec);
  e->size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  e->uid = st.st_uid;
  e->gid = st.st_gid;
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  e->nlink = static_cast<uint32_t>(st.st_nlink);
  e->stated = true;
}

// Queues a symlink with its target, read at dirfd and name ("": the link
// that dirfd is). A target that cannot be read is reported under `shown` and
// the walk goes on. False: the consumer has cancelled the walk.
bool push_symlink(int dirfd, const char* name, const std::string& shown, Entry e,
                  EntryQueue* out, Report* report) {
  e.kind = Kind::kSymlink;
  char buf[4096];
  const ssize_t n = ::readlinkat(dirfd, name, buf, sizeof buf);
  if (n < 0) {
    report->error(classify_errno(errno), shown, std::strerror(errno));
    return true;
  }
  e.link.assign(buf, static_cast<size_t>(n));
  return out->push(std::move(e));
}

bool walk_dir(int dirfd, const std::string& rel, const std::string& open_path,
              const WalkOptions& options, EntryQueue* out, Report* report) {
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* dir = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (dir == nullptr) {
    report->error(classify_errno(errno), open_path,
                  std::string("cannot list directory: ") + std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return true;
  }
  const std::vector<std::string> names = sorted_names(dir);
  bool go_on = true;
  for (const std::string& name : names) {
    if (!go_on) break;
    struct stat st {};
    std::string child_open = open_path;
    child_open.append("/").append(name);
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      report->error(classify_errno(errno), child_open, std::strerror(errno));
      continue;
    }
    Entry e;
    e.rel = rel;
    e.rel.append("/").append(name);
    if (options.excluded && options.excluded(e.rel, S_ISDIR(st.st_mode))) continue;
    e.open = child_open;
    fill_meta(st, &e);
    if (S_ISREG(st.st_mode)) {
      e.kind = Kind::kFile;
      go_on = out->push(std::move(e));
    } else if (S_ISLNK(st.st_mode)) {
      go_on = push_symlink(fd, name.c_str(), child_open, std::move(e), out, report);
    } else if (S_ISDIR(st.st_mode)) {
      e.kind = Kind::kDir;
      const int sub =
          ::openat(fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) {
        report->error(classify_errno(errno), child_open, std::strerror(errno));
        continue;
      }
      std::string child_rel = e.rel;
      go_on = out->push(std::move(e)) &&
              walk_dir(sub, child_rel, child_open, options, out, report);
      ::close(sub);
    } else {
      std::fprintf(stderr, "rdmakit-cp: %s: skipped (not a file, directory or symlink)\n",
                   child_open.c_str());
    }
  }
  ::closedir(dir);
  return go_on;
}

}  // namespace

int open_source(const SourceRoot& root, const std::string& path) {
  return open_at(root, path, O_RDONLY | O_NOFOLLOW);
}

bool walk_source(const SourceRoot& root, const std::string& source,
                 const WalkOptions& options, EntryQueue* out, Report* report) {
  const std::string name = source_name(source);
  if (name.empty() || name == "." || name == ".." || name == "/") {
    report->error(Failure::kUsage, source,
                  "name a file or directory, not '.', '..' or '/'");
    return true;
  }
  if (root.confined) {
    const std::string why = check_relative(source);
    if (!why.empty()) {
      report->error(Failure::kRefused, source, why);
      return true;
    }
  }
  const int fd = open_at(root, source, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    report->error(
        classify_errno(-fd), source,
        -fd == EXDEV ? "refused: the path leaves the served root" : std::strerror(-fd));
    return true;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    report->error(classify_errno(errno), source, std::strerror(errno));
    ::close(fd);
    return true;
  }
  Entry e;
  e.rel = name;
  e.open = source;
  fill_meta(st, &e);
  if (options.excluded && options.excluded(e.rel, S_ISDIR(st.st_mode))) {
    ::close(fd);
    return true;
  }
  bool go_on = true;
  if (S_ISREG(st.st_mode)) {
    e.kind = Kind::kFile;
    go_on = out->push(std::move(e));
  } else if (S_ISLNK(st.st_mode)) {
    go_on = push_symlink(fd, "", source, std::move(e), out, report);
  } else if (S_ISDIR(st.st_mode)) {
    if (!options.recursive) {
      report->error(Failure::kFile, source, "is a directory (use -r)");
    } else {
      e.kind = Kind::kDir;
      go_on = out->push(std::move(e)) && walk_dir(fd, name, source, options, out, report);
    }
  } else {
    report->error(Failure::kFile, source, "not a regular file, directory or symlink");
  }
  ::close(fd);
  return go_on;
}

BlockHasher::BlockHasher() : state_(XXH3_createState()), saved_(XXH3_createState()) {}
BlockHasher::~BlockHasher() {
  XXH3_freeState(state_);
  XXH3_freeState(saved_);
}

uint64_t BlockHasher::digest() const { return XXH3_64bits_digest(state_); }

void BlockHasher::checkpoint() {
  XXH3_copyState(saved_, state_);
  saved_pos_ = pos_;
}

void BlockHasher::rollback() {
  XXH3_copyState(state_, saved_);
  pos_ = saved_pos_;
}

void BlockHasher::start(uint32_t block, uint64_t file_size) {
  XXH3_64bits_reset(state_);
  active_ = true;
  block_ = block;
  pos_ = uint64_t{block} * kBlockSize;
  end_ = std::min(pos_ + kBlockSize, file_size);
}

void BlockHasher::zeros(uint64_t n) {
  static const std::byte kZero[65536] = {};
  while (n > 0) {
    const size_t k = std::min<uint64_t>(n, sizeof kZero);
    XXH3_64bits_update(state_, kZero, k);
    n -= k;
  }
}

void BlockHasher::data(uint64_t offset, std::span<const std::byte> bytes) {
  if (offset > pos_) zeros(offset - pos_);
  XXH3_64bits_update(state_, bytes.data(), bytes.size());
  pos_ = offset + bytes.size();
}

uint64_t BlockHasher::finish() {
  if (!active_) return 0;
  if (end_ > pos_) zeros(end_ - pos_);
  active_ = false;
  const uint64_t h = XXH3_64bits_digest(state_);
  return h == 0 ? 1 : h;  // 0 is reserved for "all hole"
}

uint64_t hash_file_block(int fd, uint64_t size, uint32_t b,
                         std::vector<std::byte>* scratch, bool* io_error) {
  const uint64_t start = uint64_t{b} * kBlockSize;
  const uint64_t end = std::min(start + kBlockSize, size);
  const off_t data = ::lseek(fd, static_cast<off_t>(start), SEEK_DATA);
  if (data < 0 || static_cast<uint64_t>(data) >= end) return 0;  // all hole
  scratch->resize(end - start);
  uint64_t got = 0;
  while (got < end - start) {
    const ssize_t n = ::pread(fd, scratch->data() + got, end - start - got,
                              static_cast<off_t>(start + got));
    if (n <= 0) {
      *io_error = true;
      return 0;
    }
    got += static_cast<uint64_t>(n);
  }
  const uint64_t h = XXH3_64bits(scratch->data(), end - start);
  return h == 0 ? 1 : h;
}

std::vector<uint64_t> block_hashes(int fd, uint64_t size, bool* io_error) {
  std::vector<std::byte> scratch;
  std::vector<uint64_t> hashes(block_count(size));
  for (uint32_t b = 0; b < hashes.size() && !*io_error; ++b)
    hashes[b] = hash_file_block(fd, size, b, &scratch, io_error);
  return hashes;
}

uint64_t file_hash(const std::vector<uint64_t>& block_hashes) {
  return XXH3_64bits(block_hashes.data(), block_hashes.size() * sizeof(uint64_t));
}

}  // namespace rdmakit::cp
