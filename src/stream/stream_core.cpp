// A stream's setup, errors, close and readiness (stream_core.hpp).
#include "stream/stream_core.hpp"

#include <algorithm>
#include <cerrno>
#include <vector>

namespace rdmakit::stream::detail {

StreamCore::StreamCore(EngineImpl& e, Context& ctx, const StreamOptions& options)
    : engine(e), opt(options) {
  rx_ = ctx.allocate(opt.rx_ring, kAccessLocalWrite | kAccessRemoteWrite);
  tx_ = ctx.allocate(opt.tx_buffer, kAccessLocalWrite);
  // Plain heap memory: only this side writes it (a provider copies a
  // record's bytes in at its completion), so it needs no shared mapping.
  const size_t rec_bytes = static_cast<size_t>(opt.recv_credits) * wire::kRecordStride;
  rec_buf_ = std::make_unique<std::byte[]>(rec_bytes);
  rec_mr_ = ctx.register_memory(rec_buf_.get(), rec_bytes, kAccessLocalWrite);
  flow_.rx_size = opt.rx_ring;
  send_depth_ = 2 * opt.recv_credits + 8;
}

wire::Hello StreamCore::hello() const noexcept {
  wire::Hello h;
  h.recv_credits = static_cast<uint16_t>(opt.recv_credits);
  h.record_max = static_cast<uint8_t>(flow_.rx_record_max);  // our buffers' size
  h.ring = rx_->remote();
  return h;
}

bool StreamCore::attach(uint32_t slot, uint8_t gen, std::unique_ptr<QueuePair> qp,
                        const wire::Hello& peer) {
  slot_ = slot;
  gen_ = gen;
  peer_ = qp->peer();
  qp_ = std::move(qp);
  peer_ring_ = peer.ring;
  flow_.peer_ring = static_cast<uint32_t>(peer.ring.length);
  flow_.peer_credits = peer.recv_credits;
  flow_.msg_credits = peer.recv_credits;
  flow_.peer_rewinds = (peer.features & wire::Hello::kFeatureRewind) != 0;
  record_max_ =
      static_cast<uint8_t>(std::min<uint32_t>(peer.record_max, qp_->max_inline()));
  last_rx_ = last_tx_ = Clock::now();
  send_depth_ = qp_->options().max_send_wr;
  repost_batch_ = std::clamp<uint32_t>(opt.recv_credits / 8, 1, kMaxRepostBatch);
  std::vector<RecvWr> recvs(opt.recv_credits);
  for (uint32_t i = 0; i < opt.recv_credits; ++i) recvs[i] = record_recv(i);
  recv_posted_ = opt.recv_credits;
  const PostResult r = qp_->post_recv(recvs);
  published_.store(events(), std::memory_order_release);
  return r.ok();
}

size_t StreamCore::memory_bytes() const noexcept {
  // Buffers plus the queue slots the provider keeps per QP (send: request +
  // inline copy; receive: one entry each), as configured.
  return static_cast<size_t>(opt.rx_ring) + opt.tx_buffer +
         static_cast<size_t>(opt.recv_credits) * wire::kRecordStride +
         static_cast<size_t>(send_depth_) * (sizeof(SendWr) + opt.max_inline) +
         static_cast<size_t>(opt.recv_credits) * sizeof(RecvWr) + sizeof(StreamCore);
}

void StreamCore::fail(int err, Status status) noexcept {
  if (err_ != 0) return;
  // Tell a live peer (a timeout or a protocol violation leaves our QP up).
  if (err != ECONNRESET && qp_ && flow_.msg_credits >= wire::kCloseReserve)
    (void)post_control(wire::encode(wire::Op::kCtrl, 0, wire::kRst));
  err_ = err;
  err_status_ = status;
  // Bytes from a peer that broke the protocol are not delivered.
  if (err == EPROTO) flow_.rx_read = flow_.rx_written;
  update();
}

void StreamCore::hide_error() noexcept {
  if (err_ == 0) return;
  err_hidden_ = true;
  readiness_.clear_error();
  published_.store(events(), std::memory_order_release);
}

void StreamCore::mark_closed() noexcept {
  closed_ = true;
  wr_shut_ = true;
  rd_shut_ = true;
  flow_.rx_read = flow_.rx_written;
  linger_deadline_ = Clock::now() + opt.linger;
  readiness_.close();
}

void StreamCore::mark_aborted() noexcept {
  closed_ = true;
  aborted_ = true;
  wr_shut_ = true;
  rd_shut_ = true;
  flow_.rx_read = flow_.rx_written;  // unread bytes dropped
  tx_staged_ = tx_posted_;           // unsent bytes dropped (posted ones are out)
  linger_deadline_ = Clock::now() + opt.linger;
  readiness_.close();
}

bool StreamCore::finished() const noexcept {
  if (!closed_) return false;
  const bool drained = fin_sent_ && tx_freed_ == tx_staged_ && sends_outstanding_ == 0;
  if (err_ == 0 && !drained) return false;
  // An abort's RST (and the data posted before it) must leave before the QP.
  return !(aborted_ && sends_outstanding_ > 0 && Clock::now() < linger_deadline_);
}

void StreamCore::note_traffic(Clock::time_point now) noexcept {
  if (rx_msgs_ != rx_seen_) {
    rx_seen_ = rx_msgs_;
    last_rx_ = now;
  }
  if (tx_msgs_ != tx_seen_) {
    tx_seen_ = tx_msgs_;
    last_tx_ = now;
  }
}

void StreamCore::show_ended() noexcept {
  // The readiness fd's end-of-stream, hang-up and error states (before
  // readiness_.set()).
  if ((err_ != 0 || flow_.fin_received) && !readiness_.hung_up())
    readiness_.set_ended(true, err_ != 0 || fin_sent_, err_ != 0 && !err_hidden_);
}

void StreamCore::update() noexcept {
  // Published before the fd changes: a thread the fd wakes (the preload's
  // hooks answer from last_events() without the lock) must find the new
  // state there. Storing it after the fd's system calls made such readers
  // see data the fd had announced as absent (EAGAIN in preload_epoll_*).
  published_.store(events(), std::memory_order_release);
  if (readiness_.is_open()) {
    bool can_read = readable();
    // Data found by a caller that takes it next: signalling it would cost
    // a send now and a recv when the read empties the ring, for a state no
    // one else needs to see (a sleeper on the fd would find the data gone;
    // if some is left, the read's own update signals it). Only data is
    // deferred: end of stream and errors are signalled at once.
    const bool defer = defer_readable_ && can_read && !readiness_.readable() &&
                       flow_.available() > 0 && err_ == 0 && !flow_.fin_received &&
                       !rd_shut_;
    readiness_stale_ = defer;
    if (defer) can_read = false;
    show_ended();
    readiness_.set(can_read, writable());
  }
  wake_waiters();
}

int StreamCore::readiness_fd() noexcept {
  if (!readiness_.is_open()) {
    const int rc = readiness_.open();
    if (rc < 0) return rc;
    show_ended();
    readiness_.set(readable(), writable());
  }
  return readiness_.fd();
}

void StreamCore::set_lazy_readiness(bool on) noexcept {
  lazy_readiness_ = on;
  defer_readable_ = on;
  if (!on && readiness_stale_) update();
}

}  // namespace rdmakit::stream::detail
