#pragma once
// A large source file mapped and registered, so that the sender WRITEs its
// bytes straight from the page cache: the provider's send (tcp: the
// kernel's socket copy; shm: the copy into the peer) is then the only copy,
// where reading into a slot first cost a second one (`pread`, a third of the
// sending CPU on a 2 GiB push). The sender hashes the bytes through the
// mapping; a file truncated after it was mapped raises SIGBUS there, which
// guarded_read() turns into a failure of that file instead of a crash.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <rdmakit/rdmakit.hpp>
#include <string>

namespace rdmakit::cp {

class MappedSource {
 public:
  // Maps the first `size` bytes of `fd` read-only and registers them with
  // `context`; nullptr with *why set if either fails.
  static std::shared_ptr<MappedSource> map(Context& context, int fd, uint64_t size,
                                           std::string* why);
  ~MappedSource();
  MappedSource(const MappedSource&) = delete;
  MappedSource& operator=(const MappedSource&) = delete;

  const std::byte* data() const noexcept { return base_; }
  uint64_t size() const noexcept { return size_; }
  uint32_t lkey() const noexcept { return mr_->lkey(); }

 private:
  MappedSource(std::byte* base, uint64_t size) : base_(base), size_(size) {}
  std::byte* base_;
  uint64_t size_;
  std::unique_ptr<MemoryRegion> mr_;
};

// Runs `read` (which reads a mapping and must not allocate, lock or throw);
// false if it hit SIGBUS (the file is shorter than its mapping now), true
// otherwise. Any other SIGBUS keeps its default action.
bool guarded_read(const std::function<void()>& read);

}  // namespace rdmakit::cp
