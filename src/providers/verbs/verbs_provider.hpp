#pragma once
// Internal classes of the verbs provider. Everything a context creates holds
// a shared_ptr<Device>, so the protection domain outlives its users whatever
// order the application destroys objects in.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/cq_budget.hpp"
#include "providers/verbs/verbs_device.hpp"
#include "providers/verbs/verbs_objects.hpp"
#include "rdmakit/context.hpp"

namespace rdmakit::verbs {

inline constexpr const char* kProvider = "verbs";

// Our handshake rides in rdma_cm private data, ahead of the caller's bytes:
//   0 kHandshakeMagic  1 version  2 ibv_mtu (REQ: port active MTU; REP: the
//   negotiated path MTU)  3 length of the caller's private data.
// IB CM delivers private data zero-padded to its fixed size, hence the length.
inline constexpr uint8_t kHandshakeMagic = 0xa7;
inline constexpr uint8_t kHandshakeVersion = 2;
inline constexpr size_t kHandshakeSize = 4;
// IB/RoCE CM: REQ carries 92 bytes of private data, of which rdma_cm's own
// header takes 36; REP carries 196. When the connect private data does not
// fit in the REQ, the REQ carries its first kReqOverflowUserData bytes and
// the address and rkey (8 + 4 bytes, little-endian) of a remotely readable
// buffer with the rest, which the acceptor READs once established (sequence
// 0 of its send queue; each QP gets one extra send slot for it). A READ, not a
// SEND: a QP on a shared receive queue has no receive queue of its own.
inline constexpr size_t kCmReqPrivateData = 56;
inline constexpr size_t kCmRepPrivateData = 196;
inline constexpr size_t kReqUserData = kCmReqPrivateData - kHandshakeSize;
inline constexpr size_t kOverflowDescriptorSize = 12;
inline constexpr size_t kReqOverflowUserData = kReqUserData - kOverflowDescriptorSize;
inline constexpr size_t kMaxAcceptPrivateData = kCmRepPrivateData - kHandshakeSize;
static_assert(kMaxAcceptPrivateData >= Context::kMaxPrivateData,
              "accept must carry the core's full private data");

class ProgressThread;
struct SrqCore;

// One opened device + port + protection domain.
struct Device {
  CmDeviceList cm_devices;  // keeps librdmacm's ibv_context open
  ibv_context* context = nullptr;
  DeviceInfo info;
  uint8_t port = 1;
  ibv_port_attr port_attr{};
  GidInfo gid;
  bool gid_overridden = false;
  PdHandle pd;
  std::once_flag progress_once;
  std::unique_ptr<ProgressThread>
      progress_thread;  // declared last: its thread stops first

  std::string name() const { return info.name; }
  ProgressThread& get_progress_thread();  // started with the first connection
  ~Device();
};

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

// Connection-lifetime state the progress thread updates.
struct ConnState {
  std::atomic<bool> disconnected{false};
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

// Watches connected rdma_cm ids on one event channel (a thread per context,
// started with the first connection): a DISCONNECTED event (peer closed or
// its process died) moves our QP to the error state so outstanding work
// flushes instead of hanging.
class ProgressThread {
 public:
  ProgressThread();
  ~ProgressThread();
  // Moves the id onto the progress thread's channel; every event on it must be acked.
  void adopt(rdma_cm_id* id, ibv_qp* qp, std::shared_ptr<ConnState> conn,
             const std::string& peer);
  void release(rdma_cm_id* id) noexcept;

 private:
  struct Entry {
    ibv_qp* qp;
    std::shared_ptr<ConnState> conn;
    std::string peer;
  };
  void run() noexcept;

  EventChannelHandle channel_;
  int wake_fd_ = -1;
  std::mutex mutex_;
  std::unordered_map<rdma_cm_id*, Entry> entries_;
  std::thread thread_;
};

}  // namespace rdmakit::verbs
