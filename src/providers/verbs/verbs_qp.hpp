#pragma once
// The verbs queue pair: QpCore, the work-request bookkeeping its poster and
// its CQs share; its place on those CQs; the post path (one preallocated
// postlist, one ibv_post_send).
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_objects.hpp"
#include "providers/verbs/verbs_progress.hpp"
#include "rdmakit/detail/conditional_lock.hpp"
#include "rdmakit/queue_pair.hpp"

namespace rdmakit::verbs {

class VerbsCq;
struct SrqCore;

// Per-QP work-request bookkeeping shared by the QP (poster) and its CQs
// (poller). The wr_id handed to the device is our sequence number (bit 63
// marks receives); the caller's wr_id and opcode wait in a ring, so even error
// completions, whose opcode verbs leaves undefined, report them exactly.
struct alignas(64) QpCore {
  static constexpr uint64_t kRecvBit = 1ull << 63;

  struct SendSlot {
    uint64_t wr_id;
    Opcode opcode;
  };

  QpCore(uint32_t qp_num, uint32_t send_depth, uint32_t recv_depth);

  uint32_t qp_num;
  uint32_t send_depth;
  uint32_t recv_depth;
  uint64_t send_mask;
  uint64_t recv_mask;
  std::vector<SendSlot> send_ring;
  std::vector<uint64_t> recv_ring;
  // Written by the poster only.
  uint64_t send_posted = 0;
  uint64_t recv_posted = 0;
  // Poster -> poller: ring entries below this are written (release/acquire).
  std::atomic<uint64_t> send_published{0};
  std::atomic<uint64_t> recv_published{0};
  // Poller -> poster: slots below this are free again. An unsignaled send
  // retires only when a later signaled (or error) completion is polled.
  alignas(64) std::atomic<uint64_t> send_retired{0};
  std::atomic<uint64_t> recv_retired{0};
  // accept()'s READ of the rest of the connect private data (send sequence
  // 0): whichever thread polls its completion records the ibv_wc_status
  // here instead of returning it; kHandshakeIdle when none is in flight.
  static constexpr int kHandshakeIdle = -2;
  static constexpr int kHandshakePending = -1;
  std::atomic<int> handshake_status{kHandshakeIdle};
  // Set by the poller when a completion of this QP failed (the QP is in the
  // error state). The poller then moves the QP to the error state again,
  // flushing RECVs posted before it saw the failure; RECVs posted after it
  // are flushed by the poster.
  std::atomic<bool> failed{false};
  // For that move; owned by the VerbsQp, which outlives its registration.
  ibv_qp* qp = nullptr;
};

// QP transport settings derived from QpOptions (documented in
// docs/verbs-provider.md).
struct RetrySettings {
  uint8_t timeout = 14;  // local ACK timeout exponent: 4.096 us * 2^timeout
  uint8_t retry_cnt = 3;
  uint8_t rnr_retry = 6;
  uint8_t min_rnr_timer = 12;  // IB encoding of the RNR NAK delay we ask for
};
RetrySettings retry_settings(const QpOptions& options) noexcept;

// A QP's place on its CQs, taken right after ibv_create_qp: completions
// that arrive before connect()/accept() return (a QP on an SRQ receives as
// soon as it is RTR) are then translated, not dropped as a stranger's.
class CqAttachment {
 public:
  CqAttachment(VerbsCq* send_cq, VerbsCq* recv_cq, QpCore* core,
               std::shared_ptr<SrqCore> srq, const std::string& peer);
  ~CqAttachment();
  CqAttachment(const CqAttachment&) = delete;
  CqAttachment& operator=(const CqAttachment&) = delete;

 private:
  VerbsCq* send_cq_;
  VerbsCq* recv_cq_;
  QpCore* core_;
  std::shared_ptr<SrqCore> srq_;
};

class VerbsQp final : public QueuePair {
 public:
  struct Parts {
    QpHandle qp;
    std::unique_ptr<QpCore> core;
    VerbsCq* send_cq = nullptr;
    VerbsCq* recv_cq = nullptr;
    std::shared_ptr<SrqCore> srq;              // set when QpOptions::srq names one
    std::unique_ptr<CqAttachment> attachment;  // after core: detaches first
    QpOptions options;                         // with max_inline as granted
    // Buffer of the private-data overflow (READ by the server from the
    // client's); the client's lives as long as the QP, since it cannot tell
    // when the peer's READ is done.
    std::vector<std::byte> handshake_buf;
    MrHandle handshake_mr;
  };

  VerbsQp(std::shared_ptr<Device> device, CmIdHandle id, Parts parts, std::string peer,
          std::vector<std::byte> peer_private_data, std::shared_ptr<ConnState> conn);
  ~VerbsQp() override;

  QpState state() const noexcept override;
  QpCore* core() const noexcept { return core_.get(); }

 protected:
  PostResult do_post_send(std::span<const SendWr> wrs) noexcept override;
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  PostResult post_send_locked(std::span<const SendWr> wrs) noexcept;
  PostResult post_recv_locked(std::span<const RecvWr> wrs) noexcept;
  void flush_in_error() noexcept;

  std::shared_ptr<Device> device_;
  CmIdHandle id_;
  QpHandle qp_;
  std::unique_ptr<QpCore> core_;
  std::shared_ptr<SrqCore> srq_;  // receives come from this SRQ, not our own queue
  std::unique_ptr<CqAttachment> attachment_;
  std::shared_ptr<ConnState> conn_;
  std::vector<std::byte> handshake_buf_;
  MrHandle handshake_mr_;
  std::mutex post_mutex_;  // only when options().thread_safe
  // Preallocated postlists: one ibv_post_send per post_send, no allocation.
  std::vector<ibv_send_wr> send_wrs_;
  std::vector<ibv_sge> send_sges_;
  std::vector<ibv_recv_wr> recv_wrs_;
  std::vector<ibv_sge> recv_sges_;
};

}  // namespace rdmakit::verbs
