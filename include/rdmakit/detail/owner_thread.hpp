#pragma once
// The single-owner rule of posting objects (QPs, SRQs): unless the object is
// thread-safe, the first thread that posts owns it and other threads get
// PostStatus::kWrongThread. The thread is identified by its thread pointer
// (one register read) rather than pthread_self(), a library call per post.
namespace rdmakit::detail {

class OwnerThread {
 public:
  // any_thread: a thread-safe object, or one whose caller serializes calls.
  bool admits(bool any_thread) noexcept {
    if (any_thread) return true;
    const void* self = current();
    if (owner_ == nullptr) owner_ = self;
    return owner_ == self;
  }

 private:
  static const void* current() noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
    return __builtin_thread_pointer();
#else
    static thread_local const char marker = 0;
    return &marker;
#endif
  }

  const void* owner_ = nullptr;
};

}  // namespace rdmakit::detail
