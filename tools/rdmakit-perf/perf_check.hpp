#pragma once
// How rdmakit-perf fails: any error ends the run with an exception that names
// what was asked and the status, caught and printed in main.cpp.
#include <chrono>
#include <stdexcept>
#include <string>

#include "fmt/format.h"
#include "rdmakit/rdmakit.hpp"

namespace rdmakit::perf {

[[noreturn]] inline void fail(const std::string& what) { throw std::runtime_error(what); }

inline void check_post(const PostResult& r, const char* what) {
  if (!r.ok()) fail(fmt::format("{}: post failed: {}", what, post_status_name(r.status)));
}

inline void check_completion(const Completion& c) {
  if (!c.ok()) {
    fail(fmt::format("{} completion failed: {} (wr_id {:#x}, vendor_err {})",
                     opcode_name(c.opcode), status_name(c.status), c.wr_id,
                     c.vendor_err));
  }
}

inline bool is_recv_opcode(Opcode op) {
  return op == Opcode::kRecv || op == Opcode::kRecvWriteWithImm;
}

// Fails a loop that makes no progress for `timeout`; reads the clock only
// every `mask + 1` idle turns so a busy loop stays cheap.
class Watchdog {
 public:
  Watchdog(double timeout_s, std::string what, bool event)
      : timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(timeout_s))),
        what_(std::move(what)),
        mask_(event ? 0 : 4095),
        last_(std::chrono::steady_clock::now()) {}
  void progress() noexcept { ++progress_; }
  void idle() {
    if ((++idle_ & mask_) != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (progress_ != seen_) {
      seen_ = progress_;
      last_ = now;
    } else if (now - last_ > timeout_) {
      fail(fmt::format("{}: no progress for {:.1f} s", what_,
                       std::chrono::duration<double>(timeout_).count()));
    }
  }

 private:
  std::chrono::steady_clock::duration timeout_;
  std::string what_;
  uint64_t mask_;
  uint64_t idle_ = 0, progress_ = 0, seen_ = 0;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace rdmakit::perf
