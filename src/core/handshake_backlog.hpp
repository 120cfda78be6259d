#pragma once
// The handshakes a listener has accepted and not yet completed (shm, tcp and
// verbs listeners): a bounded set in arrival order. A silent client costs a
// place here, not the time of the clients behind it; when the set is full
// the next client drops the oldest (it has had the most time). Guarded by
// its listener's lock; control path only.
#include <cstddef>
#include <utility>
#include <vector>

namespace rdmakit::core {

inline constexpr size_t kMaxPendingHandshakes = 64;

template <typename T, size_t Capacity = kMaxPendingHandshakes>
class HandshakeBacklog {
 public:
  static_assert(Capacity > 0);
  static constexpr size_t kCapacity = Capacity;

  bool empty() const noexcept { return items_.empty(); }
  size_t size() const noexcept { return items_.size(); }
  // The next emplace() drops the oldest: log it first.
  bool full() const noexcept { return items_.size() >= Capacity; }
  T& operator[](size_t i) noexcept { return items_[i]; }
  const T& operator[](size_t i) const noexcept { return items_[i]; }
  const T& front() const noexcept { return items_.front(); }
  auto begin() noexcept { return items_.begin(); }
  auto end() noexcept { return items_.end(); }
  auto begin() const noexcept { return items_.begin(); }
  auto end() const noexcept { return items_.end(); }

  // Appends a handshake, after dropping the oldest when full().
  template <typename... Args>
  T& emplace(Args&&... args) {
    if (full()) items_.erase(items_.begin());
    return items_.emplace_back(std::forward<Args>(args)...);
  }
  // Removes handshake i (the others keep their order) and returns it.
  T take(size_t i) {
    T taken = std::move(items_[i]);
    erase(i);
    return taken;
  }
  void erase(size_t i) { items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(i)); }

 private:
  std::vector<T> items_;
};

}  // namespace rdmakit::core
