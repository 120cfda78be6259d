#pragma once
// Pre-registered buffers in size classes. Each class is one registered slab
// cut into equal buffers; taking and returning a buffer is a free-list pop and
// push (no registration, no heap allocation). Every buffer keeps kHeadroom
// bytes in front of data() so that Channel::send(Buffer) can put the session
// header there and send the buffer with no copy.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <rdmakit/export.hpp>
#include <rdmakit/rdmakit.hpp>
#include <span>
#include <vector>

namespace rdmakit::session {

class BufferPool;

// A buffer from a pool; returns itself to the pool when destroyed.
class RDMAKIT_API Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  explicit operator bool() const noexcept { return pool_ != nullptr; }
  std::byte* data() const noexcept { return base_ + kHeadroomBytes; }
  size_t capacity() const noexcept { return capacity_; }
  // Bytes in use (what send() sends); set by the application.
  size_t size() const noexcept { return size_; }
  void resize(size_t n) noexcept { size_ = n <= capacity_ ? n : capacity_; }
  std::span<std::byte> bytes() const noexcept { return {data(), size_}; }
  uint32_t lkey() const noexcept { return lkey_; }
  void reset() noexcept;

  static constexpr size_t kHeadroomBytes = 16;

 private:
  friend class BufferPool;

  BufferPool* pool_ = nullptr;
  std::byte* base_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
  uint32_t lkey_ = 0;
  uint16_t size_class_ = 0;
  uint32_t index_ = 0;
};

struct SizeClass {
  size_t size;     // usable bytes per buffer (headroom comes on top)
  uint32_t count;  // buffers in the class
};

class RDMAKIT_API BufferPool {
 public:
  // Allocates and registers one slab per class (Context::allocate, so shm
  // peers map it directly). Throws Error if registration fails.
  BufferPool(Context& ctx, std::vector<SizeClass> classes,
             uint32_t access = kAccessLocalWrite);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // The smallest class that holds `size` bytes; an empty Buffer if none has
  // a free buffer (or size exceeds the largest class). Thread-safe.
  Buffer get(size_t size) noexcept;
  uint32_t available(size_t size_class) const noexcept;
  size_t classes() const noexcept { return classes_.size(); }

 private:
  friend class Buffer;
  void put(Buffer& buffer) noexcept;

  struct Class {
    size_t size;
    size_t stride;
    std::unique_ptr<MemoryRegion> slab;
    std::vector<uint32_t> free;  // stack of free indices (reserved up front)
  };
  mutable std::mutex mu_;
  std::vector<Class> classes_;
};

}  // namespace rdmakit::session
