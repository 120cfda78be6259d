#pragma once
// The tcp queue pair: initiator (send queue, responses) and target
// (requests served against the region table) over one non-blocking TCP
// socket. tcp_qp.cpp posts and transmits; tcp_qp_receive.cpp receives
// frames and executes the peer's requests.
#include <sys/epoll.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fd.hpp"
#include "providers/tcp/tcp_cq.hpp"
#include "providers/tcp/tcp_mr.hpp"
#include "providers/tcp/tcp_progress.hpp"
#include "providers/tcp/tcp_srq.hpp"
#include "providers/tcp/tcp_wire.hpp"
#include "rdmakit/queue_pair.hpp"

namespace rdmakit::tcp {

class TcpQp final : public QueuePair {
 public:
  TcpQp(std::shared_ptr<TcpProgress> progress, int fd, const QpOptions& options,
        const Hello& peer_hello, std::string peer,
        std::vector<std::byte> peer_private_data);
  ~TcpQp() override;
  QpState state() const noexcept override {
    return state_.load(std::memory_order_acquire);
  }

  // Drives the socket: transmit, receive, serve, time out. Try-lock based;
  // returns false if someone else holds the QP.
  bool try_progress(int64_t now) noexcept;
  // Progress thread entry; returns true if it wants a fast re-tick.
  bool thread_service(int64_t now, int epoll_fd) noexcept;
  void retire_to(uint64_t seq) noexcept {
    sq_retired_.store(seq, std::memory_order_release);
  }
  void retire_recv() noexcept { rq_retired_.fetch_add(1, std::memory_order_release); }
  TcpSrq* srq() const noexcept { return srq_; }
  uint32_t recv_depth() const noexcept {
    return srq_ != nullptr ? srq_->max_wr() : options_.max_recv_wr;
  }
  // Called by the SRQ after a post: a SEND may be stalled waiting for it.
  bool rnr_stalled() const noexcept {
    return hint_stalled_.load(std::memory_order_relaxed);
  }
  int socket_fd() const noexcept { return fd_.get(); }
  // Deregistration of `entry` has waited `held_ns`: past our peer_timeout a
  // transfer of ours that still pins it is cut (the QP goes to error).
  void cut_if_pinning(const MrEntry* entry, int64_t held_ns) noexcept;
  bool wants_service() const noexcept { return skipped_.load(std::memory_order_seq_cst); }
  // The socket's epoll registration while the progress thread serves it:
  // edge-triggered and kept, so serving a request costs no epoll_ctl (a
  // one-shot registration needed a re-arm syscall per served READ). Every
  // exit of a receive pass that leaves bytes in the socket keeps the QP busy
  // (RNR stall, full transmit ring, receive budget), so the thread's fast
  // tick, not a new edge, brings it back. EPOLLOUT edges come only after
  // the socket refused bytes (a blocked transmit).
  static constexpr uint32_t kEpollEvents = EPOLLIN | EPOLLOUT | EPOLLET;
  // Epoll bookkeeping, touched only by the progress thread under its mutex.
  // armed: registered with kEpollEvents. While an application thread drives
  // the QP the registration is emptied (one epoll_ctl when the thread stands
  // back, one when it takes over), so edges do not wake the thread per op.
  bool ep_armed = false;
  bool ep_event = false;

 protected:
  PostResult do_post_send(std::span<const SendWr> wrs) noexcept override;
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  struct SendSlot {
    SendWr wr;
    Status local_error = Status::kSuccess;  // set at post; fails in order
  };
  struct TxItem {
    std::array<std::byte, kHeaderSize> hdr;
    const std::byte* payload = nullptr;
    uint32_t payload_len = 0;
    uint64_t sent = 0;
    MrEntry* ref = nullptr;  // pinned region for READ responses
    bool request = false;
    bool cancelled = false;
  };
  enum class RxState : uint8_t { kHeader, kPayload };
  enum class PayloadDone : uint8_t { kDiscard, kWrite, kWriteImm, kSend, kReadResp };
  enum class FrameResult : uint8_t { kConsumed, kStall, kFatal };

  void progress(int64_t now, bool from_poll) noexcept;
  void queue_pending_ack() noexcept;
  void flush_tx(int64_t now) noexcept;
  void rx(int64_t now) noexcept;
  bool fill(int64_t now) noexcept;
  FrameResult handle_frame(const Header& h, int64_t now) noexcept;
  FrameResult handle_request(const Header& h, int64_t now) noexcept;
  FrameResult handle_response(const Header& h) noexcept;
  void finish_payload() noexcept;
  void start_payload(uint64_t len, std::byte* dst, MrEntry* ref,
                     PayloadDone done) noexcept;
  void abort_payload_sink() noexcept;
  void timers(int64_t now) noexcept;
  void publish_hints() noexcept;
  void pump_sends() noexcept;
  std::byte* inline_slot(uint64_t seq) noexcept;

  bool tx_full(uint32_t need) const noexcept {
    return tx_tail_ - tx_head_ + need > tx_.size();
  }
  TxItem& tx_push() noexcept;
  void queue_control(WireOp op, uint64_t seq, Status status = Status::kSuccess,
                     uint64_t arg0 = 0) noexcept;
  void queue_nak(uint64_t seq, Status status) noexcept;

  void complete_send(uint64_t seq, Status status, uint32_t vendor_err = 0) noexcept;
  void complete_recv(const RecvWr& wr, Opcode op, uint32_t len, bool has_imm,
                     uint32_t imm, Status status) noexcept;
  bool claim_recv() noexcept;  // takes the next RECV (own queue or SRQ) into cur_recv_
  bool peer_host_alive() const noexcept;
  void advance_local_errors() noexcept;
  void enter_error() noexcept;
  void die(Status head_status, int err, const char* why) noexcept;
  void protocol_error(const char* why) noexcept;

  std::shared_ptr<TcpProgress> progress_;
  MrTable& mrs_;
  TcpCq* send_cq_;
  TcpCq* recv_cq_;
  TcpSrq* srq_;
  core::Fd fd_;
  Hello peer_hello_;
  SpinLock mu_;
  std::atomic<QpState> state_{QpState::kConnected};
  std::atomic<bool> skipped_{false};
  // Copies of lock-protected state for the progress thread's quick look.
  std::atomic<bool> hint_busy_{false};
  std::atomic<bool> hint_dead_{false};
  std::atomic<bool> hint_stalled_{false};
  std::atomic<int64_t> hint_timer_ns_{0};
  bool dead_ = false;
  bool destroyed_ = false;
  bool flushed_ = false;  // error state entered and outstanding work flushed

  // Send queue: seq -> slot seq % size. retired <= completed <= sent <= posted.
  std::vector<SendSlot> sq_;
  std::unique_ptr<std::byte[]> inline_buf_;
  uint64_t sq_posted_ = 0, sq_sent_ = 0, sq_completed_ = 0;
  std::atomic<uint64_t> sq_retired_{0};

  // Own receive queue (unused with an SRQ): head = claimed, tail = posted;
  // a slot is free again once its completion has been polled.
  std::vector<RecvWr> rq_;
  uint64_t rq_head_ = 0, rq_tail_ = 0;
  std::atomic<uint64_t> rq_retired_{0};
  RecvWr cur_recv_{};  // the RECV the message being received fills
  bool has_cur_recv_ = false;

  std::vector<TxItem> tx_;
  uint64_t tx_head_ = 0, tx_tail_ = 0;
  // Gathers of at most this many bytes are copied here and sent with one
  // send() instead of sendmsg() (cheaper syscall path).
  static constexpr size_t kCoalesceMax = 1024;

  // Receive side: a small staging buffer saves a syscall per small frame;
  // large payloads are received straight into their destination.
  static constexpr uint32_t kStageSize = 16384;
  static constexpr uint64_t kDirectMin = 4096;
  std::unique_ptr<std::byte[]> stage_;
  std::unique_ptr<std::byte[]> tx_stage_;
  uint32_t sb_ = 0, se_ = 0;
  RxState rx_state_ = RxState::kHeader;
  bool rx_drained_ = false;  // this rx() pass saw a short read
  bool rx_more_ = false;     // this rx() pass ran out of budget: frames may be staged
  bool tx_full_ = false;     // the socket took less than offered
  std::byte* pdst_ = nullptr;
  uint64_t premain_ = 0;
  uint64_t plen_ = 0;
  MrEntry* pref_ = nullptr;
  PayloadDone pdone_ = PayloadDone::kDiscard;
  Header phdr_;
  bool pending_ack_ = false;
  uint64_t ack_seq_ = 0;
  bool discard_requests_ = false;  // after a NAK: the initiator is in error
  int64_t stall_since_ = 0;        // RNR: waiting for a RECV since then

  int64_t last_rx_ns_ = 0, last_tx_ns_ = 0, next_timer_ns_ = 0;
  int64_t heartbeat_ns_ = 0, peer_timeout_ns_ = 0, rnr_ns_ = 0;
};

// Normalizes options the way connect/accept do (used by adopt as well).
QpOptions adjust_options(const QpOptions& options);

// Bounds on what a peer's HELLO may ask of us (docs/tcp-provider.md,
// "What one connection can cost"). Its peer_timeout sets our heartbeat
// rate (a quarter of it): at the floor, 40 per second.
inline constexpr int64_t kPeerTimeoutFloorMs = 100;
inline constexpr int64_t kPeerTimeoutCeilingMs = 3'600'000;
// Responses the peer's requests may have queued at once: its max_send_wr,
// clamped to the larger of our own two depths.
uint32_t peer_response_depth(const QpOptions& local, const Hello& peer) noexcept;

}  // namespace rdmakit::tcp
