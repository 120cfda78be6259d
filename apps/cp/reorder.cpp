#include "reorder.hpp"

#include <algorithm>

namespace rdmakit::cp {

ReorderWindow::ReorderWindow(uint32_t window)
    : window_(std::clamp<uint32_t>(window, 1, kCapacity)) {}

ReorderWindow::Put ReorderWindow::put(uint32_t seq, Place where) {
  // Unsigned difference: a sequence number below next_ wraps far outside.
  if (seq - next_ >= window_) return Put::kOutside;
  Cell& c = cells_[seq % kCapacity];
  if (c.full) {
    // The same number again is a re-sent slot only once the writer asked
    // for it; until then it is a duplicate. Another number in the same
    // cell cannot be within the window.
    if (c.seq != seq) return Put::kOutside;
    return Put::kDuplicate;
  }
  c = Cell{true, seq, where};
  pending_++;
  return Put::kOk;
}

bool ReorderWindow::take(Place* out) {
  Cell& c = cells_[next_ % kCapacity];
  if (!c.full || c.seq != next_) return false;
  *out = c.where;
  c.full = false;
  pending_--;
  return true;
}

}  // namespace rdmakit::cp
