#pragma once
// The single-owner rule of posting objects (QPs, SRQs): unless the object is
// thread-safe, the first thread that posts owns it and other threads get
// PostStatus::kWrongThread. A thread id compare, cheap enough for the data path.
#include <thread>

namespace rdmakit::detail {

class OwnerThread {
 public:
  bool admits(bool thread_safe) noexcept {
    if (thread_safe) return true;
    const auto self = std::this_thread::get_id();
    if (owner_ == std::thread::id()) owner_ = self;
    return owner_ == self;
  }

 private:
  std::thread::id owner_{};
};

}  // namespace rdmakit::detail
