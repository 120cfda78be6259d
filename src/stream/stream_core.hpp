#pragma once
// One stream's state: its QP and buffers, the flow control of both
// directions (wire::Flow), the send buffer, the close and error state and
// the readiness it shows. The Stream handle (stream.cpp) and the engine
// (engine*.cpp) change it only through the member functions below, always
// with the engine lock (EngineImpl::mu) held. The functions of the data path
// are inline here; the rest are in stream_core.cpp, except the control
// messages out (engine_tx.cpp) and the checks of messages in and the
// re-posting of receives (engine_rx.cpp).
#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "rdmakit/detail/bit_fields.hpp"
#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"
#include "stream/iov.hpp"
#include "stream/readiness.hpp"
#include "stream/wire.hpp"

namespace rdmakit::stream::detail {

using Clock = std::chrono::steady_clock;

// wr_id: [slot:24][generation:8][kind:4][count:7][bytes:21]. Completions are
// routed by slot and checked against the generation, so a completion of a
// stream that was already destroyed is dropped, never applied to its
// successor. A send completion retires `count` sends (itself and the
// unsignaled inline sends before it) and frees `bytes` of the send buffer.
enum WrKind : uint64_t { kWrSend = 1, kWrRecv = 2 };
constexpr uint32_t kSignalEvery = 16;  // inline data sends per signaled one
using WrId = rdmakit::detail::BitFields<24, 8, 4, 7, 21>;
static_assert(kSignalEvery <= WrId::max<3>(), "count fits its 7 bits");
constexpr uint64_t make_wr_id(uint32_t slot, uint8_t gen, WrKind kind, uint32_t bytes,
                              uint32_t count = 1) {
  return WrId::encode(slot, gen, kind, count, bytes);
}
constexpr uint32_t wr_slot(uint64_t wr_id) { return WrId::decode<0, uint32_t>(wr_id); }
constexpr uint8_t wr_gen(uint64_t wr_id) { return WrId::decode<1, uint8_t>(wr_id); }
constexpr uint64_t wr_kind(uint64_t wr_id) { return WrId::decode<2>(wr_id); }
constexpr uint32_t wr_count(uint64_t wr_id) { return WrId::decode<3, uint32_t>(wr_id); }
constexpr uint32_t wr_bytes(uint64_t wr_id) { return WrId::decode<4, uint32_t>(wr_id); }
static_assert(make_wr_id(0xABCDEF, 0x5A, kWrRecv, 0x1FFFFF, 127) == 0xABCDEF5A2FFFFFFF);
// One WRITE from the send buffer; < 2^22 (imm value) and < 2^21 (wr_id bytes).
constexpr uint32_t kMaxChunk = 1u << 20;
static_assert(kMaxChunk <= WrId::max<4>());
// Receives re-posted together: at most 1/8 of the credits wait (so the
// peer keeps its reserves), at most kMaxRepostBatch per post.
constexpr uint32_t kMaxRepostBatch = 16;

class EngineImpl;

class StreamCore {
 public:
  // Allocates and registers the stream's rings and record buffers.
  StreamCore(EngineImpl& engine, Context& ctx, const StreamOptions& options);
  StreamCore(const StreamCore&) = delete;
  StreamCore& operator=(const StreamCore&) = delete;

  EngineImpl& engine;
  const StreamOptions opt;
  // Settings of the handle (Stream::set_nonblocking, set_timeouts).
  bool nonblocking = false;
  std::chrono::milliseconds read_timeout{0};
  std::chrono::milliseconds write_timeout{0};

  // --- Setup (engine.cpp)
  // The hello this side sends: its ring and credits.
  wire::Hello hello() const noexcept;
  // Takes the connected QP and the peer's hello, posts every receive.
  // False: the receives could not be posted (the caller fails the stream).
  bool attach(uint32_t slot, uint8_t gen, std::unique_ptr<QueuePair> qp,
              const wire::Hello& peer);
  uint32_t slot() const noexcept { return slot_; }
  uint8_t gen() const noexcept { return gen_; }
  const std::string& peer() const noexcept { return peer_; }
  bool has_qp() const noexcept { return qp_ != nullptr; }
  uint32_t max_inline() const noexcept { return qp_->max_inline(); }
  // The largest DATA record we send: the peer's hello and our QP's
  // max_inline() decide it at attach(); 0 when the peer takes none.
  uint32_t record_max() const noexcept { return record_max_; }
  size_t memory_bytes() const noexcept;

  // --- Reading (Stream::readv)
  bool read_shut() const noexcept { return rd_shut_; }
  bool fin_received() const noexcept { return flow_.fin_received; }
  uint64_t available() const noexcept { return flow_.available(); }
  // Copies n <= available() unread bytes to the cursor, leaves them unread.
  void copy_unread(IovCursor& to, size_t n) const noexcept {
    ring_to_iov(rx_->data(), flow_.rx_size, flow_.rx_read, to, n);
  }
  // The application took n bytes: their ring space is credited back.
  void consume(size_t n) noexcept { flow_.rx_read += n; }
  // shutdown(SHUT_RD): unread and later bytes are discarded (and credited).
  void shut_read() noexcept {
    rd_shut_ = true;
    flow_.rx_read = flow_.rx_written;
  }

  // --- Writing (Stream::writev, EngineImpl::pump)
  bool write_shut() const noexcept { return wr_shut_; }
  // shutdown(SHUT_WR): a FIN follows the queued data (pump).
  void shut_write() noexcept { wr_shut_ = true; }
  // Bytes wait in the send buffer, not yet posted.
  bool send_queued() const noexcept { return tx_posted_ < tx_staged_; }
  uint64_t tx_free() const noexcept { return opt.tx_buffer - (tx_staged_ - tx_freed_); }
  // A DATA may be posted as far as message credits (keeping the reserve
  // for CREDIT, FIN, RST) and the send queue go; ring room is data_target's.
  bool can_post_data() const noexcept {
    return flow_.msg_credits >= wire::kDataReserve && sends_outstanding_ < send_depth_;
  }
  bool can_post_data_now() const noexcept {
    return flow_.peer_room() > 0 && can_post_data();
  }
  // Where the next DATA lands in the peer's ring.
  struct DataTarget {
    uint64_t room;    // bytes the peer's credits leave
    uint32_t rewind;  // wire::kRewind: start over at the ring's beginning
    uint64_t offset;  // in the peer's ring
    uint64_t to_end;  // from offset to the ring's end (a WRITE never wraps)
  };
  DataTarget data_target() const noexcept {
    const uint32_t rewind = flow_.rewind_due();
    const uint64_t offset = rewind != 0 ? 0 : flow_.tx_sent % flow_.peer_ring;
    return {flow_.peer_room(), rewind, offset, flow_.peer_ring - offset};
  }
  enum class DataKind : uint8_t {
    kInlineRecord,  // the caller's bytes inside a SEND (wire.hpp: records)
    kInlineWrite,   // the caller's bytes, INLINE WRITE_WITH_IMM into the ring
    kBuffered,      // the send buffer's next bytes, WRITE_WITH_IMM
  };
  PostResult post_data(const DataTarget& at, DataKind kind, std::byte* src,
                       uint32_t len) noexcept;
  // The next WRITE of queued bytes: bounded by the queue, ring room, the
  // ends of both buffers and kMaxChunk.
  uint32_t buffered_chunk(const DataTarget& at) const noexcept {
    const uint64_t toff = tx_posted_ % opt.tx_buffer;
    return static_cast<uint32_t>(
        std::min({tx_staged_ - tx_posted_, at.room, opt.tx_buffer - toff, at.to_end,
                  static_cast<uint64_t>(kMaxChunk)}));
  }
  // An empty send buffer starts again at its beginning (its offsets are ours
  // alone), so small writes keep to its first pages.
  void restart_empty_send_buffer() noexcept {
    if (tx_freed_ == tx_staged_ && tx_staged_ % opt.tx_buffer != 0) {
      const uint64_t skip = opt.tx_buffer - tx_staged_ % opt.tx_buffer;
      tx_freed_ += skip;
      tx_posted_ += skip;
      tx_staged_ += skip;
    }
  }
  // Copies n <= tx_free() bytes from the cursor into the send buffer.
  void stage(IovCursor& from, size_t n) noexcept {
    iov_to_ring(tx_->data(), opt.tx_buffer, tx_staged_, from, n);
    tx_staged_ += n;
  }

  // --- Control messages out (engine_tx.cpp). Each returns whether it was
  // posted; not posted, it is tried again at the next pump.
  bool credit_due() const noexcept;
  bool send_credit() noexcept;
  bool fin_due() const noexcept {
    return wr_shut_ && !fin_sent_ && tx_posted_ == tx_staged_ &&
           flow_.msg_credits >= wire::kCloseReserve;
  }
  bool send_fin() noexcept;
  bool keepalive_due(Clock::time_point now) const noexcept {
    return now - last_tx_ >= opt.keepalive && flow_.msg_credits >= wire::kCreditReserve;
  }
  bool send_keepalive() noexcept;
  // abort(): RST instead of FIN; while no credit or send slot is free it
  // stays pending (rst_pending) and pump retries, sending nothing else.
  bool rst_pending() const noexcept { return rst_pending_; }
  void send_rst() noexcept;

  // --- Completions (engine_rx.cpp)
  // A send completion: retires its sends, frees its bytes if it succeeded.
  void retire_sends(uint64_t wr_id, bool ok) noexcept {
    sends_outstanding_ -= std::min(sends_outstanding_, wr_count(wr_id));
    if (ok) tx_freed_ += wr_bytes(wr_id);
  }
  // A successful receive: checks it against the protocol (wire::Flow) and
  // places a record's bytes in the ring. kViolation: nothing was applied.
  wire::Flow::Result accept_message(const Completion& c) noexcept;
  // Counts a consumed receive; true when a batch is due for re-posting.
  bool count_consumed_receive() noexcept { return ++repost_pending_ >= repost_batch_; }
  bool receives_waiting() const noexcept { return repost_pending_ > 0; }
  // Re-posts consumed receives (one post for up to a batch) and counts them
  // as message credits to report. False: the post failed.
  bool repost_receives() noexcept;
  bool rst_received() const noexcept { return flow_.rst_received; }
  // After shutdown(SHUT_RD) arriving bytes are discarded (and credited).
  void discard_if_read_shut() noexcept {
    if (rd_shut_) flow_.rx_read = flow_.rx_written;
  }

  // --- Errors (stream_core.cpp)
  int error() const noexcept { return err_; }
  Status error_status() const noexcept { return err_status_; }
  // The stream fails with err (first error only): a live peer is told with
  // an RST, a protocol breaker's bytes are dropped, readiness is updated.
  void fail(int err, Status status) noexcept;
  // Stream::hide_error(): the error stays, POLLERR goes.
  void hide_error() noexcept;

  // --- Close (stream_core.cpp)
  bool closed() const noexcept { return closed_; }
  // close(): the handle is gone; queued data is delivered, then FIN, within
  // the linger time. Unread bytes are discarded.
  void mark_closed() noexcept;
  // abort(): also drops unsent bytes; the caller sends the RST.
  void mark_aborted() noexcept;
  // A closed stream whose slot may be freed now: drained (or failed), and an
  // abort's RST gone or its linger over.
  bool finished() const noexcept;
  bool linger_expired(Clock::time_point now) const noexcept {
    return closed_ && now >= linger_deadline_;
  }

  // --- Liveness (engine_timers.cpp turns message counts into times, so no
  // message pays a clock read)
  void note_traffic(Clock::time_point now) noexcept;
  Clock::duration silent_for(Clock::time_point now) const noexcept {
    return now - last_rx_;
  }

  // --- Readiness (stream_core.cpp)
  bool readable() const noexcept {
    return flow_.available() > 0 || flow_.fin_received || rd_shut_ || err_ != 0;
  }
  bool writable() const noexcept { return err_ != 0 || wr_shut_ || tx_free() > 0; }
  short events() const noexcept {
    short ev = 0;
    if (readable()) ev |= POLLIN;
    if (writable()) ev |= POLLOUT;
    if (flow_.fin_received) ev |= POLLRDHUP;
    if (err_ != 0 || (flow_.fin_received && fin_sent_)) ev |= POLLHUP;
    if (err_ != 0 && !err_hidden_) ev |= POLLERR;
    return ev;
  }
  // events() as of the last update(): what poll_readiness() reports while
  // another thread holds the engine lock (no lock needed).
  short last_events() const noexcept {
    return published_.load(std::memory_order_acquire);
  }
  // Publishes events(), brings the readiness fd up to date, wakes waiters.
  void update() noexcept;
  // Stream::fd(): opens the readiness fd on first use. fd or -errno.
  int readiness_fd() noexcept;
  // While a caller that reads next polls (poll_readiness with reads_next):
  // the stream's becoming readable with data is not signalled on the
  // readiness fd (a stale fd, readiness_stale()); the read that follows,
  // which takes the data, brings the fd up to date (update()).
  void begin_poll(bool reads_next, bool about_to_sleep) noexcept {
    defer_readable_ = (reads_next || lazy_readiness_) && !about_to_sleep;
  }
  void end_poll() noexcept { defer_readable_ = lazy_readiness_; }
  // Stream::set_lazy_readiness: deferral outside poll_readiness too.
  void set_lazy_readiness(bool on) noexcept;
  bool readiness_stale() const noexcept { return readiness_stale_; }

  // --- Waiting (EngineImpl::wait): sleeps on the stream's condition
  // variable until pred() or the deadline; update() wakes it.
  template <class Pred>
  bool sleep_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                   Pred pred) {
    ++waiters_;
    const bool ok = cv_.wait_until(lock, deadline, pred);
    --waiters_;
    return ok;
  }
  void wake_waiters() noexcept {
    if (waiters_ > 0) cv_.notify_all();
  }

 private:
  bool post_control(uint32_t imm) noexcept;  // CREDIT/CTRL (engine_tx.cpp)
  void show_ended() noexcept;
  // The receive that uses record buffer idx.
  RecvWr record_recv(uint32_t idx) const noexcept {
    return RecvWr{make_wr_id(slot_, gen_, kWrRecv, idx),
                  rec_buf_.get() + static_cast<size_t>(idx) * wire::kRecordStride,
                  wire::kRecordData, rec_mr_->lkey()};
  }

  uint32_t slot_ = 0;
  uint8_t gen_ = 0;
  uint8_t record_max_ = 0;
  std::string peer_;

  std::unique_ptr<MemoryRegion> rx_;  // our ring, remote-writable
  std::unique_ptr<MemoryRegion> tx_;  // send buffer, local only
  // Receive buffers for DATA records (wire::kRecordData bytes each, one per
  // posted receive: receive n uses buffer n % recv_credits; receives
  // complete in posted order). Destroyed after the QP.
  std::unique_ptr<std::byte[]> rec_buf_;
  std::unique_ptr<MemoryRegion> rec_mr_;
  uint64_t recv_posted_ = 0;
  std::unique_ptr<QueuePair> qp_;
  RemoteRegion peer_ring_;
  wire::Flow flow_;

  // Send buffer: [tx_freed, tx_posted) in flight, [tx_posted, tx_staged) queued.
  uint64_t tx_staged_ = 0;
  uint64_t tx_posted_ = 0;
  uint64_t tx_freed_ = 0;
  uint32_t sends_outstanding_ = 0;  // posted, not yet retired by a completion
  uint32_t unsignaled_ = 0;         // inline sends since the last signaled one
  uint32_t send_depth_ = 0;
  uint32_t repost_pending_ = 0;  // receives consumed, re-posted in batches
  uint32_t repost_batch_ = 1;

  bool wr_shut_ = false;  // shutdown(SHUT_WR) or close(): FIN after the data
  bool fin_sent_ = false;
  bool rd_shut_ = false;
  bool closed_ = false;  // the handle is gone; finalize when drained
  bool aborted_ = false;
  bool rst_pending_ = false;
  int err_ = 0;
  Status err_status_ = Status::kSuccess;
  bool err_hidden_ = false;  // Stream::hide_error(): no POLLERR any more
  uint64_t rx_msgs_ = 0;
  uint64_t tx_msgs_ = 0;
  uint64_t rx_seen_ = 0;
  uint64_t tx_seen_ = 0;
  Clock::time_point last_rx_;
  Clock::time_point last_tx_;
  Clock::time_point linger_deadline_{};

  Readiness readiness_;
  bool defer_readable_ = false;
  bool lazy_readiness_ = false;
  bool readiness_stale_ = false;
  std::atomic<short> published_{0};
  std::condition_variable cv_;
  uint32_t waiters_ = 0;
};

// The one DATA post: the writer's inline fast path and the send buffer's
// pump both come here, so the message and its bookkeeping (credits, ring
// position, rewind, reported receives, selective signaling) are one.
inline PostResult StreamCore::post_data(const DataTarget& at, DataKind kind,
                                        std::byte* src, uint32_t len) noexcept {
  const bool buffered = kind == DataKind::kBuffered;
  // A send from the send buffer is always signaled: its completion frees the
  // bytes. Inline ones ask for a completion once per kSignalEvery, and when
  // the send queue is nearly full.
  const bool signal = buffered || unsignaled_ + 1 >= kSignalEvery ||
                      sends_outstanding_ + 2 >= send_depth_;
  SendWr wr;
  wr.wr_id =
      make_wr_id(slot_, gen_, kWrSend, buffered ? len : 0, signal ? unsignaled_ + 1 : 0);
  wr.opcode =
      kind == DataKind::kInlineRecord ? Opcode::kSendWithImm : Opcode::kWriteWithImm;
  wr.length = len;
  if (buffered) {
    wr.flags = kSignaled;
    wr.local_addr = tx_->data() + tx_posted_ % opt.tx_buffer;
    wr.lkey = tx_->lkey();
  } else {
    wr.flags = signal ? (kSignaled | kInline) : kInline;
    wr.local_addr = src;
  }
  wr.imm = wire::encode(wire::Op::kData, flow_.rx_unreported, len | at.rewind);
  if (kind != DataKind::kInlineRecord) {
    wr.remote_addr = peer_ring_.addr + at.offset;
    wr.rkey = peer_ring_.rkey;
  }
  const PostResult r = qp_->post_send(wr);
  if (!r.ok()) return r;
  unsignaled_ = signal ? 0 : unsignaled_ + 1;
  flow_.take_unreported();
  if (at.rewind != 0) flow_.rewind();
  flow_.tx_sent += len;
  if (buffered) tx_posted_ += len;
  --flow_.msg_credits;
  ++sends_outstanding_;
  ++tx_msgs_;
  return r;
}

}  // namespace rdmakit::stream::detail
