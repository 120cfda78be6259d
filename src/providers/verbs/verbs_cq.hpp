#pragma once
// The verbs completion queue: ibv_poll_cq translated into the core's
// completions (the caller's wr_id and opcode from the QP's rings), armed on
// a completion channel.
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/cq_budget.hpp"
#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_objects.hpp"
#include "rdmakit/completion_queue.hpp"

namespace rdmakit::verbs {

struct QpCore;
struct SrqCore;

class VerbsCq final : public CompletionQueue {
 public:
  VerbsCq(std::shared_ptr<Device> device, const CqOptions& options);
  ~VerbsCq() override;

  int poll(std::span<Completion> out) noexcept override;
  int fd() const noexcept override { return channel_->fd; }
  bool arm() noexcept override;

  ibv_cq* cq() const noexcept { return cq_.get(); }
  const Device& device() const noexcept { return *device_; }

  // QPs register so completions can be translated; `depth` is what the QP
  // may have outstanding here, checked against the capacity (a verbs CQ
  // that overflows is a fatal asynchronous error, not back-pressure).
  void attach(QpCore* core, uint32_t depth, const std::string& peer);
  void detach(QpCore* core, uint32_t depth) noexcept;
  // The receive side of a QP on an SRQ: the SRQ's depth is committed once
  // per CQ however many of its QPs complete here, and the CQ keeps the
  // SRQ's bookkeeping alive for completions still queued after a QP is gone.
  void attach_srq(QpCore* core, const std::shared_ptr<SrqCore>& srq,
                  const std::string& peer);
  void detach_srq(QpCore* core, const SrqCore* srq) noexcept;

  // The completion of `core`'s handshake READ (sequence 0 of its send
  // queue) if it has arrived, without waiting; completions of other QPs met
  // meanwhile are kept for poll().
  std::optional<ibv_wc> poll_handshake(QpCore* core);

 private:
  bool translate(const ibv_wc& wc, Completion* out) noexcept;
  void consume_event() noexcept;

  std::shared_ptr<Device> device_;
  CompChannelHandle channel_;
  CqHandle cq_;
  bool armed_ = false;      // ibv_req_notify_cq issued, event not consumed yet
  bool has_stash_ = false;  // a completion arm() found while re-polling
  ibv_wc stash_{};
  // Completions wait_handshake() polled for the application (under
  // qps_mutex_; the owner looks only when has_pending_ says so).
  std::vector<Completion> pending_;
  size_t pending_head_ = 0;
  std::atomic<bool> has_pending_{false};
  std::mutex qps_mutex_;  // attach/detach vs poll
  std::vector<QpCore*> qps_;
  struct SrqUse {
    std::shared_ptr<SrqCore> srq;
    uint32_t qps = 0;  // attached QPs; the SRQ's depth is committed while > 0
  };
  std::vector<SrqUse> srqs_;
  QpCore* last_ = nullptr;
  core::CqBudget budget_{0};  // sum of attached depths
};

}  // namespace rdmakit::verbs
