#pragma once
// tcp provider internals: one TCP connection per queue pair, framed requests
// (wire.hpp), a progress engine that serves one-sided operations at the
// target. Exposed as a header so the fuzzer and white-box tests can drive a
// queue pair over a socketpair without a handshake.
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cq_budget.hpp"
#include "core/fd.hpp"
#include "providers/tcp/wire.hpp"
#include "rdmakit/context.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

int64_t now_ns() noexcept;

// Test-and-test-and-set lock: held for a few hundred nanoseconds by whoever
// drives a queue pair (poller, poster or the progress thread).
class SpinLock {
 public:
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) &&
           !flag_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept;
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

// One registered region. Slots are never freed while the context lives, so a
// stale pointer is always safe to read; `rkey == 0` means free/deregistered.
struct MrEntry {
  std::atomic<uint32_t> rkey{0};
  std::atomic<uint32_t> lkey{0};
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  // Remote accesses in progress. Deregistration waits for zero, so no byte
  // lands in a region after its MemoryRegion is destroyed.
  std::atomic<uint32_t> users{0};
};

// Lock-free lookup of rkeys/lkeys. A key is a secret, per-context
// permutation of (random tag << 16 | slot): all 32 bits look random to a
// peer, so a blind guess names a live region with probability
// live/2^32 and a known key says nothing about the keys of other slots,
// yet the slot comes back with one inverse permutation (no search).
class MrTable {
 public:
  static constexpr uint32_t kSlots = 1u << 16;
  MrTable();
  // Throws Error(ENOSPC) when every slot is in use.
  MrEntry* add(uint64_t addr, uint64_t length, uint32_t access);
  // Makes later lookups fail, then waits for in-flight accesses.
  void remove(MrEntry* entry) noexcept;
  // Pins the region for a remote access of [addr, addr+len) needing `need`.
  // Returns nullptr (and nothing is pinned) on any violation.
  MrEntry* acquire(uint32_t rkey, uint64_t addr, uint64_t len, uint32_t need) noexcept;
  static void release(MrEntry* entry) noexcept {
    if (entry != nullptr) entry->users.fetch_sub(1, std::memory_order_release);
  }
  // Local key check at post time (no pin: the caller owns that memory).
  bool check_local(uint32_t lkey, const void* addr, uint64_t len,
                   uint32_t need) const noexcept;
  // Deterministic keys for the fuzzer's seed corpus; never used otherwise.
  void reseed_for_testing(uint32_t seed) {
    test_rng_.seed(seed);
    deterministic_ = true;
    new_secret();
  }
  // The slot a key names (inverse permutation); tests use it.
  uint32_t slot_of(uint32_t key) const noexcept { return unmix(key) & (kSlots - 1); }

 private:
  static constexpr int kRounds = 4;
  void new_secret();
  uint64_t random64();
  uint32_t make_key(uint32_t slot);
  uint32_t mix(uint32_t plain) const noexcept;
  uint32_t unmix(uint32_t key) const noexcept;
  uint32_t round_fn(int round, uint32_t half) const noexcept;
  uint64_t secret_[kRounds] = {};
  std::unique_ptr<MrEntry[]> slots_;
  std::mutex mu_;  // control path only: add/remove
  std::vector<uint32_t> free_;
  uint32_t next_ = 1;          // slot 0 is never used
  std::random_device random_;  // getrandom(): keys must not be predictable
  std::mt19937_64 test_rng_;
  bool deterministic_ = false;
};

class TcpQp;

// Per-context engine: region table, progress thread, epoll set of sockets.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  explicit Engine(bool progress_thread);
  ~Engine();
  MrTable& mrs() noexcept { return mrs_; }
  uint32_t next_qp_num() noexcept { return qp_num_.fetch_add(1); }
  void add_qp(TcpQp* qp);
  void remove_qp(TcpQp* qp) noexcept;
  void kick() noexcept;  // wake the progress thread

 private:
  void run() noexcept;
  MrTable mrs_;
  std::atomic<uint32_t> qp_num_;
  std::mutex mu_;  // guards qps_; held by the thread while it serves them
  std::vector<TcpQp*> qps_;
  core::Fd epoll_fd_;
  core::Fd wake_fd_;
  bool with_thread_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// What polling a completion frees: the verbs slot rule for send queues,
// and likewise for receive queues and SRQs, so a CQ sized to the depths
// attached to it can never overrun (see TcpCq::reserve).
// kOrphan: the QP is gone; the entry still holds CQ room until polled.
enum class Retire : uint8_t { kNone, kSend, kRecv, kSrq, kOrphan };

struct CqEntry {
  Completion c;
  TcpQp* retire_qp = nullptr;  // null once the QP is gone
  uint64_t retire_seq = 0;     // kSend: the slot's sequence number
  Retire retire = Retire::kNone;
};

class TcpSrq;

class TcpCq final : public CompletionQueue {
 public:
  TcpCq(std::shared_ptr<Engine> engine, const CqOptions& options);
  ~TcpCq() override;
  int poll(std::span<Completion> out) noexcept override;
  int fd() const noexcept override { return event_fd_.get(); }
  bool arm() noexcept override;

  // Producer side (any thread, under the producing QP's lock).
  void push(const CqEntry& entry) noexcept;
  // Control path: commits `depth` completions (an SRQ's max_wr once per
  // SRQ). Throws Error(EINVAL) when capacity would be exceeded, so the
  // ring can never overrun and no completion is ever dropped.
  void reserve(uint32_t depth, TcpSrq* srq, const char* op, const std::string& peer);
  void unreserve(uint32_t depth, TcpSrq* srq) noexcept;
  // True if `depth` plus an SRQ's `srq_depth` (unless already counted here)
  // still fits; checked before connecting.
  bool has_room(uint32_t depth, uint32_t srq_depth, TcpSrq* srq) noexcept;
  void attach(TcpQp* qp);
  // Stops polls from driving qp (waits for one that is).
  void detach(TcpQp* qp) noexcept;
  // Once qp can push nothing more: its entries stay pollable but no longer
  // name it, and stay charged against capacity until polled.
  void orphan(TcpQp* qp) noexcept;
  // True while an application thread is busy-polling this CQ, so the
  // progress thread keeps off its queue pairs (no contention, no thread hop).
  bool driving(int64_t now) const noexcept {
    return !armed_.load(std::memory_order_seq_cst) &&
           now - last_poll_ns_.load(std::memory_order_relaxed) < kDriveWindowNs;
  }
  bool armed() const noexcept { return armed_.load(std::memory_order_seq_cst); }
  uint64_t overflows() const noexcept { return overflows_; }
  uint32_t capacity() const noexcept { return static_cast<uint32_t>(ring_.size()); }

  static constexpr int64_t kDriveWindowNs = 200'000;

 private:
  std::shared_ptr<Engine> engine_;
  SpinLock ring_lock_;  // producers are the QPs' drivers, possibly several
  std::vector<CqEntry> ring_;
  uint64_t head_ = 0, tail_ = 0;
  uint64_t overflows_ = 0;
  core::Fd event_fd_;
  std::atomic<bool> armed_{false};
  std::atomic<int64_t> last_poll_ns_{0};
  std::mutex attach_mu_;  // QP create/destroy vs poll (poll only try_locks)
  std::vector<TcpQp*> qps_;
  core::CqBudget budget_{0};                        // reserved depths (under attach_mu_)
  std::atomic<uint64_t> orphans_{0};                // destroyed QPs' unpolled entries
  std::vector<std::pair<TcpSrq*, uint32_t>> srqs_;  // SRQ -> QPs counted once
};

// Shared receive queue: a FIFO ring of RECVs claimed by whichever attached
// QP's SEND/WRITE_WITH_IMM arrives first. Posters and the QPs' drivers
// (pollers, the progress thread) meet under a spin lock held for a copy.
class TcpSrq final : public SharedReceiveQueue {
 public:
  TcpSrq(std::shared_ptr<Engine> engine, const SrqOptions& options);
  ~TcpSrq() override;
  const Engine* engine() const noexcept { return engine_.get(); }
  // Takes the oldest posted RECV; false when none is posted.
  bool claim(RecvWr* out) noexcept;
  // A completion of a claimed RECV was polled (or its QP is gone): the
  // slot may be posted again.
  void retire_one() noexcept { retired_.fetch_add(1, std::memory_order_release); }
  void attach(TcpQp* qp);
  void detach(TcpQp* qp) noexcept;

 protected:
  PostResult do_post_recv(std::span<const RecvWr> wrs) noexcept override;

 private:
  std::shared_ptr<Engine> engine_;
  SpinLock lock_;
  std::vector<RecvWr> ring_;
  uint64_t head_ = 0, tail_ = 0;  // claimed, posted (under lock_)
  std::atomic<uint64_t> retired_{0};
  std::mutex attach_mu_;  // control path; post only try_locks
  std::vector<TcpQp*> qps_;
};

class TcpQp final : public QueuePair {
 public:
  TcpQp(std::shared_ptr<Engine> engine, int fd, const QpOptions& options,
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
  bool wants_service() const noexcept { return skipped_.load(std::memory_order_seq_cst); }
  // Epoll bookkeeping, touched only by the engine thread under its mutex.
  bool ep_armed = false;
  bool ep_out = false;
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

  std::shared_ptr<Engine> engine_;
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

class TcpContext final : public Context {
 public:
  explicit TcpContext(bool progress_thread);
  std::string device_name() const override { return "tcp"; }
  std::unique_ptr<MemoryRegion> register_memory(void* addr, size_t length,
                                                uint32_t access) override;
  std::unique_ptr<MemoryRegion> allocate(size_t length, uint32_t access) override;
  std::unique_ptr<CompletionQueue> create_cq(const CqOptions& options = {}) override;
  std::unique_ptr<SharedReceiveQueue> create_srq(const SrqOptions& options = {}) override;
  std::unique_ptr<Listener> listen(const std::string& address) override;
  std::unique_ptr<QueuePair> connect(
      const std::string& address, const QpOptions& options,
      std::span<const std::byte> private_data = {},
      std::chrono::milliseconds timeout = std::chrono::seconds(5)) override;
  // Wraps an already connected socket (fuzzer, white-box tests). Takes fd.
  std::unique_ptr<QueuePair> adopt(int fd, const QpOptions& options,
                                   const Hello& peer_hello, std::string peer);
  const std::shared_ptr<Engine>& engine() const noexcept { return engine_; }

 private:
  std::shared_ptr<Engine> engine_;
};

// Normalizes options the way connect/accept do (used by adopt as well).
QpOptions adjust_options(const QpOptions& options);

}  // namespace rdmakit::tcp
