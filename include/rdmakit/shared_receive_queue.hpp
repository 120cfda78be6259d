#pragma once
// A shared receive queue (ibv_srq): one pool of RECV buffers consumed by the
// SENDs and WRITE_WITH_IMMs of every QP created with QpOptions::srq. It lets
// a server with many peers post buffers for the aggregate rate instead of
// max_recv_wr per QP.
//
// Semantics (as verbs):
// - RECVs are consumed in the order they were posted, by whichever QP's
//   message arrives next. The completion goes to that QP's recv_cq and
//   carries that QP's qp_num.
// - QueuePair::post_recv on a QP attached to an SRQ returns kInvalidArgument.
// - A QP entering the error state does not flush the SRQ: its buffers stay
//   posted for the other QPs. A RECV a failing message had already consumed
//   completes with that message's error status on the QP's recv_cq.
// - No RECV available: the sender's RNR retry applies, as without an SRQ.
// - The SRQ must outlive every QP attached to it.
#include <cstdint>
#include <span>

#include "rdmakit/detail/owner_thread.hpp"
#include "rdmakit/export.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit {

struct SrqOptions {
  uint32_t max_wr = 1024;  // outstanding RECVs; providers may round up
  // false: only the thread that first posts may post (checked cheaply).
  bool thread_safe = false;
};

class RDMAKIT_API SharedReceiveQueue {
 public:
  virtual ~SharedReceiveQueue() = default;
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  PostResult post_recv(std::span<const RecvWr> wrs) noexcept {
    if (!owner_ok()) return {PostStatus::kWrongThread, 0};
    return do_post_recv(wrs);
  }
  PostResult post_recv(const RecvWr& wr) noexcept { return post_recv({&wr, 1}); }

  // Effective capacity after the provider's adjustments.
  uint32_t max_wr() const noexcept { return options_.max_wr; }
  const SrqOptions& options() const noexcept { return options_; }

 protected:
  explicit SharedReceiveQueue(const SrqOptions& options) : options_(options) {}
  virtual PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept = 0;

  SrqOptions options_;

 private:
  bool owner_ok() noexcept { return owner_.admits(options_.thread_safe); }

  detail::OwnerThread owner_;
};

}  // namespace rdmakit
