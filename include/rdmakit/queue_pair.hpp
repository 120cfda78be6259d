#pragma once
// A reliable connected queue pair. Work requests on one QP execute in order;
// completions are reported in order per queue.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "rdmakit/detail/owner_thread.hpp"
#include "rdmakit/export.hpp"
#include "rdmakit/memory.hpp"
#include "rdmakit/types.hpp"

namespace rdmakit {

class CompletionQueue;
class SharedReceiveQueue;

struct QpOptions {
  CompletionQueue* send_cq = nullptr;  // required
  CompletionQueue* recv_cq = nullptr;  // required; may equal send_cq
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;  // ignored with an srq
  // Take RECVs from this shared receive queue (same context) instead of a
  // queue of the QP's own; post_recv on the QP is then kInvalidArgument.
  SharedReceiveQueue* srq = nullptr;
  uint32_t max_inline = 64;  // providers may round up (verbs: device limit)
  // SEND with no RECV posted is retried for this long, then RNR_RETRY_EXCEEDED.
  std::chrono::milliseconds rnr_timeout{1000};
  // A peer that stops answering is declared dead after this long.
  std::chrono::milliseconds peer_timeout{2000};
  // false: only the thread that first posts may post (checked cheaply).
  bool thread_safe = false;
  // Any thread may post; the QP takes no lock and keeps no owner (libfabric's
  // FI_THREAD_DOMAIN). The caller holds one lock of its own around every
  // call on this QP, on its CQs (poll, arm) and on every other QP that
  // completes into those CQs; a thread that sleeps sleeps on the CQ's fd()
  // outside that lock, never in CompletionQueue::wait(). A completion a post
  // produces wakes a thread asleep on the armed CQ's fd. Calls that overlap
  // are undefined, as on any object shared without its lock. Ignored with
  // thread_safe.
  bool caller_serializes = false;
};

enum class QpState : uint8_t { kConnected, kError, kClosed };
RDMAKIT_API const char* qp_state_name(QpState state) noexcept;

class RDMAKIT_API QueuePair {
 public:
  virtual ~QueuePair() = default;
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  // Posts all requests and rings the doorbell once. On a QP in error the
  // requests are accepted and complete with WR_FLUSH_ERROR, as on a NIC.
  PostResult post_send(std::span<const SendWr> wrs) noexcept {
    if (!owner_ok()) return {PostStatus::kWrongThread, 0};
    return do_post_send(wrs);
  }
  PostResult post_send(const SendWr& wr) noexcept { return post_send({&wr, 1}); }
  PostResult post_recv(std::span<const RecvWr> wrs) noexcept {
    if (!owner_ok()) return {PostStatus::kWrongThread, 0};
    return do_post_recv(wrs);
  }
  PostResult post_recv(const RecvWr& wr) noexcept { return post_recv({&wr, 1}); }

  virtual QpState state() const noexcept = 0;

  uint32_t qp_num() const noexcept { return qp_num_; }
  const QpOptions& options() const noexcept { return options_; }
  const std::string& peer() const noexcept { return peer_; }
  std::span<const std::byte> peer_private_data() const noexcept {
    return peer_private_data_;
  }
  // Effective limits after the provider's adjustments.
  uint32_t max_inline() const noexcept { return options_.max_inline; }

 protected:
  QueuePair(uint32_t qp_num, const QpOptions& options, std::string peer,
            std::vector<std::byte> peer_private_data)
      : options_(options),
        qp_num_(qp_num),
        peer_(std::move(peer)),
        peer_private_data_(std::move(peer_private_data)) {}

  virtual PostResult do_post_send(std::span<const SendWr> wrs) noexcept = 0;
  virtual PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept = 0;

  QpOptions options_;  // providers may adjust limits at construction

 private:
  bool owner_ok() noexcept {
    return owner_.admits(options_.thread_safe || options_.caller_serializes);
  }

  uint32_t qp_num_;
  std::string peer_;
  std::vector<std::byte> peer_private_data_;
  detail::OwnerThread owner_;
};

}  // namespace rdmakit
