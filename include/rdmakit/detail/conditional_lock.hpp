#pragma once
// Locking only where an object is shared: a thread-safe QP or SRQ, a session
// channel that library threads share. Elsewhere the object has one owner at
// a time, and its lock is a predictable branch, no atomic instruction.
//   ConditionalLock: RAII over any mutex, taken when `take` is true.
//   ConditionalMutex: a lockable whose lock() and try_lock() take its mutex
//     only once set_shared(true) (the default); for std::lock_guard,
//     std::unique_lock and std::condition_variable_any.
#include <mutex>

namespace rdmakit::detail {

template <typename Mutex>
class [[nodiscard]] ConditionalLock {
 public:
  ConditionalLock(Mutex& mu, bool take) : mu_(take ? &mu : nullptr) {
    if (mu_ != nullptr) mu_->lock();
  }
  ~ConditionalLock() { unlock(); }
  ConditionalLock(const ConditionalLock&) = delete;
  ConditionalLock& operator=(const ConditionalLock&) = delete;

  bool owns_lock() const noexcept { return mu_ != nullptr; }
  // Releases the mutex early, if taken.
  void unlock() noexcept {
    if (mu_ != nullptr) {
      mu_->unlock();
      mu_ = nullptr;
    }
  }

 private:
  Mutex* mu_;
};

class ConditionalMutex {
 public:
  void lock() {
    if (shared_) mu_.lock();
  }
  void unlock() {
    if (shared_) mu_.unlock();
  }
  bool try_lock() { return !shared_ || mu_.try_lock(); }
  // Set once, before the object is used.
  void set_shared(bool shared) noexcept { shared_ = shared; }
  bool shared() const noexcept { return shared_; }

 private:
  std::mutex mu_;
  bool shared_ = true;
};

}  // namespace rdmakit::detail
