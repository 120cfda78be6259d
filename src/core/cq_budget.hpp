#pragma once
// A completion queue's capacity accounting. Each QP side (and each SRQ, once
// per CQ) attached to a CQ charges the completions it may have outstanding;
// attaching more than the capacity holds is refused at creation, because a
// CQ that overflows breaks every QP on it. Not synchronized: the CQ calls it
// under its own attach lock.
#include <algorithm>
#include <cstdint>
#include <string>

namespace rdmakit::core {

class CqBudget {
 public:
  explicit CqBudget(uint64_t capacity) noexcept : capacity_(capacity) {}

  // Charges depth, or throws Error(EINVAL) naming operation, provider and
  // peer. held: completions that occupy the CQ outside the budget (e.g. the
  // unpolled completions of destroyed QPs).
  void charge(uint64_t depth, const char* operation, const char* provider,
              const std::string& peer, uint64_t held = 0);
  void refund(uint64_t depth) noexcept { committed_ -= std::min(committed_, depth); }

  uint64_t capacity() const noexcept { return capacity_; }
  uint64_t committed() const noexcept { return committed_; }

 private:
  uint64_t capacity_;
  uint64_t committed_ = 0;
};

}  // namespace rdmakit::core
