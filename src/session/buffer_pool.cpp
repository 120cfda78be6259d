#include <algorithm>
#include <cerrno>
#include <rdmakit/session/buffer_pool.hpp>
#include <utility>

namespace rdmakit::session {

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    base_ = other.base_;
    capacity_ = other.capacity_;
    size_ = other.size_;
    lkey_ = other.lkey_;
    size_class_ = other.size_class_;
    index_ = other.index_;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (pool_ != nullptr) pool_->put(*this);
  pool_ = nullptr;
  base_ = nullptr;
  capacity_ = size_ = 0;
}

BufferPool::BufferPool(Context& ctx, std::vector<SizeClass> classes, uint32_t access) {
  std::sort(classes.begin(), classes.end(),
            [](const SizeClass& a, const SizeClass& b) { return a.size < b.size; });
  if (classes.empty() || classes.size() > 64) {
    throw Error("buffer pool", ctx.provider_name(), "", EINVAL, "1 to 64 size classes");
  }
  for (const SizeClass& sc : classes) {
    if (sc.size == 0 || sc.count == 0) {
      throw Error("buffer pool", ctx.provider_name(), "", EINVAL,
                  "a size class needs size > 0 and count > 0");
    }
    Class c;
    c.size = sc.size;
    // Cache-line stride so neighbouring buffers never share a line.
    c.stride = (sc.size + Buffer::kHeadroomBytes + 63) & ~size_t{63};
    c.slab = ctx.allocate(c.stride * sc.count, access | kAccessLocalWrite);
    c.free.reserve(sc.count);
    for (uint32_t i = sc.count; i > 0; --i) c.free.push_back(i - 1);
    classes_.push_back(std::move(c));
  }
}

BufferPool::~BufferPool() = default;

Buffer BufferPool::get(size_t size) noexcept {
  std::lock_guard lock(mu_);
  for (size_t k = 0; k < classes_.size(); ++k) {
    Class& c = classes_[k];
    if (c.size < size || c.free.empty()) continue;
    Buffer b;
    b.pool_ = this;
    b.index_ = c.free.back();
    c.free.pop_back();
    b.size_class_ = static_cast<uint16_t>(k);
    b.base_ = c.slab->data() + size_t{b.index_} * c.stride;
    b.capacity_ = c.size;
    b.size_ = size;
    b.lkey_ = c.slab->lkey();
    return b;
  }
  return {};
}

uint32_t BufferPool::available(size_t size_class) const noexcept {
  std::lock_guard lock(mu_);
  return size_class < classes_.size()
             ? static_cast<uint32_t>(classes_[size_class].free.size())
             : 0;
}

void BufferPool::put(Buffer& buffer) noexcept {
  std::lock_guard lock(mu_);
  classes_[buffer.size_class_].free.push_back(buffer.index_);
}

}  // namespace rdmakit::session
