#include "core/cq_budget.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "rdmakit/error.hpp"

namespace rdmakit::core {

void CqBudget::charge(uint64_t depth, const char* operation, const char* provider,
                      const std::string& peer, uint64_t held) {
  if (committed_ + held + depth > capacity_) {
    throw Error(operation, provider, peer, EINVAL,
                fmt::format("completion queue capacity {} is smaller than the work "
                            "requests its queue pairs and shared receive queues may have "
                            "outstanding ({} + {}{}); raise CqOptions::capacity",
                            capacity_, committed_, depth,
                            held == 0 ? std::string()
                                      : fmt::format(", plus {} unpolled completions of "
                                                    "destroyed queue pairs",
                                                    held)));
  }
  committed_ += depth;
}

}  // namespace rdmakit::core
