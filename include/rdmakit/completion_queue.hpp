#pragma once
// Completion queue with three event modes:
//  - busy poll: poll() never blocks and never allocates;
//  - blocking: wait() spins for a budget, then arms and sleeps (race-free);
//  - epoll: fd() is pollable. The rule (as fi_trywait):
//        if (cq.arm()) epoll_wait(...);   // arm() == false: poll first
//        n = cq.poll(out);                // always poll after waking
//    arm() re-checks for completions after arming, so a completion that
//    arrives between the last poll and the sleep is never missed.
//
// A CQ is single-owner: one thread at a time polls, waits and arms it. QPs
// attached to it post from that thread unless they are thread-safe
// (QpOptions::thread_safe), which may post from any thread, or
// caller-serialized (QpOptions::caller_serializes: any thread, under the
// caller's one lock around every call on the CQ and its QPs). QPs may be
// created and destroyed from any thread, also while the owner polls.
#include <chrono>
#include <cstdint>
#include <span>

#include "rdmakit/export.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit {

struct CqOptions {
  uint32_t capacity = 4096;  // completions held before poll; >= sum of QP depths
  std::chrono::nanoseconds spin = std::chrono::microseconds(50);  // wait() budget
};

class RDMAKIT_API CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Moves up to out.size() completions into out; returns how many. Drives
  // progress for software providers. Never blocks, never allocates.
  virtual int poll(std::span<Completion> out) noexcept = 0;

  // Spins for options().spin, then arms and sleeps on fd() until a
  // completion arrives or timeout passes. Returns the count (0 on timeout).
  int wait(std::span<Completion> out, std::chrono::nanoseconds timeout) noexcept;

  // A file descriptor that becomes readable when arm()ed and a completion
  // (or progress work) is pending. Level of readiness is cleared by arm().
  virtual int fd() const noexcept = 0;

  // Requests a wake-up on fd(). Returns false if completions (or work) are
  // already pending: poll instead of sleeping.
  virtual bool arm() noexcept = 0;

  const CqOptions& options() const noexcept { return options_; }

 protected:
  explicit CompletionQueue(const CqOptions& options) noexcept : options_(options) {}

 private:
  CqOptions options_;
};

}  // namespace rdmakit
