#pragma once
// The receiver's reorder window: slots arrive on several lanes in any order
// and are applied in stream order (their sequence numbers). A fixed ring,
// no allocation: the sender has at most kSlots slots in flight per lane, so
// an accepted sequence number is within `window` of the next one applied;
// anything else is a lying peer and refused (it could not grow the window).
#include <array>
#include <cstdint>

#include "protocol.hpp"

namespace rdmakit::cp {

class ReorderWindow {
 public:
  struct Place {
    uint32_t lane = 0;
    uint32_t slot = 0;
  };
  static constexpr uint32_t kCapacity = 2 * kMaxLanes * kSlots;
  enum class Put : uint8_t { kOk, kOutside, kDuplicate };

  // Accepts sequence numbers in [next, next + window); window <= kCapacity.
  explicit ReorderWindow(uint32_t window);
  uint32_t window() const { return window_; }
  // Files a slot that arrived with `seq`.
  Put put(uint32_t seq, Place where);
  // Takes the slot of the next sequence number out, if it arrived. The
  // number stays the next one until advance(): a damaged slot is asked for
  // again and comes back under the same number.
  bool take(Place* out);
  // The next sequence number was applied: move on to the one after it.
  void advance() { next_++; }
  uint32_t next() const { return next_; }
  // Slots filed and not applied yet.
  uint32_t pending() const { return pending_; }

 private:
  struct Cell {
    bool full = false;
    uint32_t seq = 0;
    Place where;
  };
  std::array<Cell, kCapacity> cells_{};
  uint32_t window_;
  uint32_t next_ = 0;
  uint32_t pending_ = 0;
};

}  // namespace rdmakit::cp
