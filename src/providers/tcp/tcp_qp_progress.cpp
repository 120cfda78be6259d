// The tcp queue pair, driven: progress (from a poll, a post or the
// progress thread), timers and liveness, and the receive side: frames in,
// responses matched to the send queue, the peer's requests executed
// against the region table. Posting and transmitting are in tcp_qp.cpp.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/log.hpp"
#include "core/work_request.hpp"
#include "providers/tcp/tcp_qp.hpp"

namespace rdmakit::tcp {
namespace {

constexpr int kRxBudget = 256;  // frames/reads per progress call: bounded work
// A peer whose kernel still acknowledges our heartbeats is slow (starved by
// load), not gone: it is declared dead only after this many peer_timeouts.
constexpr int64_t kSlowPeerFactor = 10;

using core::is_atomic;
using core::is_send_op;

}  // namespace

// ------------------------------------------------------------ driving

bool TcpQp::try_progress(int64_t now) noexcept {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock) return false;
  // skipped_ stays set: only the thread clears it, once it has re-armed.
  progress(now, /*from_poll=*/true);
  return true;
}

void TcpQp::publish_hints() noexcept {
  hint_busy_.store(tx_head_ != tx_tail_ || stall_since_ != 0 || sq_sent_ < sq_posted_ ||
                       pending_ack_ || rx_more_,
                   std::memory_order_relaxed);
  hint_timer_ns_.store(next_timer_ns_, std::memory_order_relaxed);
  hint_dead_.store(dead_ || destroyed_, std::memory_order_relaxed);
  hint_stalled_.store(stall_since_ != 0, std::memory_order_relaxed);
}

bool TcpQp::thread_service(int64_t now, int epoll_fd) noexcept {
  // Lock-free hints (published under mu_) decide whether to look at all.
  const bool want = ep_event || !ep_armed ||
                    now >= hint_timer_ns_.load(std::memory_order_relaxed) ||
                    hint_busy_.load(std::memory_order_relaxed);
  if (!want || hint_dead_.load(std::memory_order_relaxed)) return false;
  // An application thread is polling one of our CQs: it drives the socket,
  // so stay away (no lock contention, no wake-up). Dekker with arm(): set
  // skipped, then re-read armed; arm() sets armed, then reads skipped.
  if (send_cq_->driving(now) || recv_cq_->driving(now)) {
    skipped_.store(true, std::memory_order_seq_cst);
    if (send_cq_->driving(now) || recv_cq_->driving(now)) {
      if (ep_armed) {
        // Quiet the registration until we serve the QP again (the fast
        // tick or arm()'s kick brings us back), or every segment the poller
        // consumes would wake this thread for nothing.
        epoll_event ev{};
        ev.data.u64 = qp_num();
        if (::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd_.get(), &ev) == 0) ep_armed = false;
      }
      return true;
    }
  }
  bool out;
  bool stalled;
  bool more;
  bool dead;
  {
    std::unique_lock lock(mu_, std::try_to_lock);
    if (!lock) return true;
    ep_event = false;
    skipped_.store(false, std::memory_order_relaxed);
    progress(now, /*from_poll=*/false);
    out = tx_head_ != tx_tail_;
    stalled = stall_since_ != 0;
    // Frames left staged by the receive budget raise no epoll event.
    more = rx_more_ && !dead_;
    dead = dead_;
  }
  if (!dead && !ep_armed) {
    // Re-registering reports bytes already queued at once (epoll polls the
    // socket on MOD), so nothing that came while we stood back is missed.
    epoll_event ev{};
    ev.events = kEpollEvents;
    ev.data.u64 = qp_num();
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd_.get(), &ev) == 0) ep_armed = true;
  }
  return out || stalled || more;
}

void TcpQp::queue_pending_ack() noexcept {
  if (!pending_ack_) return;
  // An ACK still waiting for the socket is cumulative: move it forward
  // instead of queueing another (a blocked socket must not fill the ring).
  if (tx_tail_ != tx_head_) {
    TxItem& last = tx_[(tx_tail_ - 1) % tx_.size()];
    if (last.sent == 0 && last.hdr[0] == static_cast<std::byte>(WireOp::kAck)) {
      Header h;
      h.op = WireOp::kAck;
      h.seq = ack_seq_;
      encode_header(h, last.hdr.data());
      pending_ack_ = false;
      return;
    }
  }
  if (!tx_full(1)) {
    pending_ack_ = false;
    queue_control(WireOp::kAck, ack_seq_);
  }
}

void TcpQp::progress(int64_t now, bool from_poll) noexcept {
  if (dead_ || destroyed_) return;
  queue_pending_ack();  // deferred by the previous poll
  if (tx_head_ != tx_tail_) flush_tx(now);
  if (!dead_) rx(now);
  if (!dead_) pump_sends();  // completions may have released a FENCE
  // From poll, an ACK waits for the next poll or post: the application sees
  // its RECV completion one sendmsg sooner, and a reply it posts carries the
  // ACK in the same sendmsg.
  if (!dead_ && !from_poll) queue_pending_ack();
  if (!dead_ && tx_head_ != tx_tail_) flush_tx(now);
  if (!dead_ && now >= next_timer_ns_) timers(now);
  publish_hints();
}

void TcpQp::timers(int64_t now) noexcept {
  // Running late means we ourselves were off the CPU (machine load): that
  // stretch is not the peer's silence, and our heartbeats did not go out.
  const int64_t late = now - next_timer_ns_;
  if (late > heartbeat_ns_ / 2) last_rx_ns_ = std::min(now, last_rx_ns_ + late);
  next_timer_ns_ = now + heartbeat_ns_ / 2;
  // While RNR-stalled we deliberately stop reading; that is not silence.
  const int64_t silent = now - last_rx_ns_;
  if (stall_since_ == 0 && silent > peer_timeout_ns_) {
    // Under heavy load the peer's process (and so its heartbeats) may be
    // held off the CPU while its kernel still acknowledges our segments: a
    // slow peer, not a vanished one. A cut link or a dead host stops the
    // acknowledgements too, so it is still caught after peer_timeout.
    if (silent > kSlowPeerFactor * peer_timeout_ns_ || !peer_host_alive()) {
      die(Status::kRetryExceeded, ETIMEDOUT, "peer silent for longer than peer_timeout");
      return;
    }
  }
  if (now - last_tx_ns_ >= heartbeat_ns_ && tx_head_ == tx_tail_) {
    queue_control(WireOp::kHeartbeat, 0);
    flush_tx(now);
  }
}

bool TcpQp::peer_host_alive() const noexcept {
  tcp_info info{};
  socklen_t len = sizeof info;
  // Not a TCP socket (socketpair in tests and the fuzzer): silence decides.
  if (::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // Milliseconds since the peer's kernel last acknowledged or sent anything.
  const int64_t heard_ms = std::min(info.tcpi_last_ack_recv, info.tcpi_last_data_recv);
  return heard_ms * 1'000'000 < peer_timeout_ns_;
}

// ------------------------------------------------------------ receive

bool TcpQp::fill(int64_t now) noexcept {
  if (sb_ == se_) {
    sb_ = se_ = 0;
  } else if (sb_ > 0 && (se_ == kStageSize || kStageSize - sb_ < kHeaderSize)) {
    std::memmove(stage_.get(), stage_.get() + sb_, se_ - sb_);
    se_ -= sb_;
    sb_ = 0;
  }
  if (se_ == kStageSize) return false;  // cannot happen: a header is < stage
  if (rx_drained_) return false;
  for (;;) {
    const size_t want = kStageSize - se_;
    const ssize_t r = ::recv(fd_.get(), stage_.get() + se_, want, MSG_DONTWAIT);
    if (r > 0) {
      se_ += static_cast<uint32_t>(r);
      last_rx_ns_ = now;
      // A short read emptied the socket: asking again now would only return
      // EAGAIN, one syscall more before the caller sees its completion.
      rx_drained_ = static_cast<size_t>(r) < want;
      return true;
    }
    if (r == 0) {
      die(Status::kRetryExceeded, EPIPE, "peer closed the connection");
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      die(Status::kRetryExceeded, errno, "receive failed");
    }
    return false;
  }
}

void TcpQp::start_payload(uint64_t len, std::byte* dst, MrEntry* ref,
                          PayloadDone done) noexcept {
  rx_state_ = RxState::kPayload;
  premain_ = plen_ = len;
  pdst_ = dst;
  pref_ = ref;
  pdone_ = done;
}

void TcpQp::abort_payload_sink() noexcept {
  MrTable::release(pref_);
  pref_ = nullptr;
  pdst_ = nullptr;
  pdone_ = PayloadDone::kDiscard;
}

void TcpQp::rx(int64_t now) noexcept {
  rx_drained_ = false;
  rx_more_ = false;
  for (int budget = kRxBudget; budget > 0 && !dead_; --budget) {
    if (rx_state_ == RxState::kPayload) {
      if (premain_ == 0) {
        finish_payload();
        continue;
      }
      const uint32_t avail = se_ - sb_;
      if (avail != 0) {
        const uint64_t n = std::min<uint64_t>(avail, premain_);
        if (pdst_ != nullptr) {
          std::memcpy(pdst_, stage_.get() + sb_, n);
          pdst_ += n;
        }
        sb_ += static_cast<uint32_t>(n);
        premain_ -= n;
        continue;
      }
      if (pdst_ != nullptr && premain_ >= kDirectMin) {
        // Large payload: straight from the socket into the region/buffer.
        if (rx_drained_) return;
        const size_t want = static_cast<size_t>(std::min<uint64_t>(premain_, 1u << 30));
        const ssize_t r = ::recv(fd_.get(), pdst_, want, MSG_DONTWAIT);
        if (r > 0) {
          pdst_ += r;
          premain_ -= static_cast<uint64_t>(r);
          last_rx_ns_ = now;
          rx_drained_ = static_cast<size_t>(r) < want;
          continue;
        }
        if (r == 0) {
          die(Status::kRetryExceeded, EPIPE, "peer closed the connection");
          return;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          die(Status::kRetryExceeded, errno, "receive failed");
        }
        return;
      }
      if (!fill(now)) return;
      continue;
    }
    if (se_ - sb_ < kHeaderSize) {
      if (!fill(now)) return;
      continue;
    }
    // Every request may need a response slot; wait for the wire to drain
    // rather than overrun (only a peer exceeding its depth gets here).
    if (tx_full(2)) return;
    const auto h = decode_header(
        std::span<const std::byte, kHeaderSize>(stage_.get() + sb_, kHeaderSize));
    if (!h) {
      protocol_error("malformed frame header");
      return;
    }
    const FrameResult r = handle_frame(*h, now);
    if (r != FrameResult::kConsumed) return;
  }
  // Out of budget (every other exit returns above): what is left may sit
  // in the staging buffer, where no epoll event will announce it.
  rx_more_ = !dead_;
}

TcpQp::FrameResult TcpQp::handle_frame(const Header& h, int64_t now) noexcept {
  if (h.op == WireOp::kHeartbeat) {
    sb_ += kHeaderSize;
    return FrameResult::kConsumed;
  }
  if (is_response(h.op)) return handle_response(h);
  return handle_request(h, now);
}

TcpQp::FrameResult TcpQp::handle_response(const Header& h) noexcept {
  sb_ += kHeaderSize;
  if (flushed_) {
    // Everything was flushed already; late responses are dropped.
    if (h.length != 0) start_payload(h.length, nullptr, nullptr, PayloadDone::kDiscard);
    return FrameResult::kConsumed;
  }
  if (h.seq < sq_completed_ || h.seq >= sq_sent_) {
    protocol_error("response for a request not in flight");
    return FrameResult::kFatal;
  }
  const uint64_t cap = sq_.size();
  // A response for seq acknowledges every earlier SEND/WRITE; a READ or an
  // atomic in between would have needed its own response first.
  for (uint64_t s = sq_completed_; s < h.seq; ++s) {
    if (!is_send_op(sq_[s % cap].wr.opcode)) {
      protocol_error("response skipped a READ/atomic");
      return FrameResult::kFatal;
    }
  }
  while (sq_completed_ < h.seq) complete_send(sq_completed_, Status::kSuccess);
  const SendWr& wr = sq_[h.seq % cap].wr;
  switch (h.op) {
    case WireOp::kAck:
      if (!is_send_op(wr.opcode)) {
        protocol_error("ACK for a READ/atomic");
        return FrameResult::kFatal;
      }
      complete_send(h.seq, Status::kSuccess);
      break;
    case WireOp::kNak:
      complete_send(h.seq, h.status);
      enter_error();
      return FrameResult::kConsumed;
    case WireOp::kReadResp:
      if (wr.opcode != Opcode::kRead || h.length != wr.length) {
        protocol_error("READ response does not match the request");
        return FrameResult::kFatal;
      }
      phdr_ = h;
      start_payload(h.length, static_cast<std::byte*>(wr.local_addr), nullptr,
                    PayloadDone::kReadResp);
      return FrameResult::kConsumed;
    case WireOp::kAtomicResp:
      if (!is_atomic(wr.opcode)) {
        protocol_error("atomic response for another operation");
        return FrameResult::kFatal;
      }
      std::memcpy(wr.local_addr, &h.arg0, sizeof h.arg0);
      complete_send(h.seq, Status::kSuccess);
      break;
    default: protocol_error("unexpected response opcode"); return FrameResult::kFatal;
  }
  advance_local_errors();
  return FrameResult::kConsumed;
}

TcpQp::FrameResult TcpQp::handle_request(const Header& h, int64_t now) noexcept {
  const bool consumes_recv = h.op == WireOp::kSend || h.op == WireOp::kSendWithImm ||
                             h.op == WireOp::kWriteWithImm;
  auto reject = [&](Status st) {
    sb_ += kHeaderSize;
    queue_nak(h.seq, st);
    if (h.length != 0) start_payload(h.length, nullptr, nullptr, PayloadDone::kDiscard);
    return FrameResult::kConsumed;
  };
  if (discard_requests_) {
    // We NAKed earlier: the initiator is in error and flushes whatever it
    // sent after; executing any of it would break the verbs contract.
    sb_ += kHeaderSize;
    if (h.length != 0) start_payload(h.length, nullptr, nullptr, PayloadDone::kDiscard);
    return FrameResult::kConsumed;
  }
  if (flushed_) {
    // A NIC would not answer and the initiator would time out; say so at once.
    return reject(Status::kRetryExceeded);
  }
  // WRITE_WITH_IMM: check (and pin) the target before taking a RECV, since
  // an SRQ's RECV cannot be put back once taken (others may take later ones).
  MrEntry* pinned = nullptr;
  if (h.op == WireOp::kWriteWithImm && h.length != 0) {
    pinned = mrs_.acquire(h.rkey, h.addr, h.length, kAccessRemoteWrite);
    if (pinned == nullptr) return reject(Status::kRemoteAccessError);
  }
  if (consumes_recv && !claim_recv()) {
    MrTable::release(pinned);  // the frame is looked at again later
    if (stall_since_ == 0) stall_since_ = now;
    if (now - stall_since_ < rnr_ns_) return FrameResult::kStall;
    stall_since_ = 0;
    last_rx_ns_ = now;
    return reject(Status::kRnrRetryExceeded);
  }
  if (stall_since_ != 0) {
    stall_since_ = 0;
    last_rx_ns_ = now;  // we were not reading: do not count it as silence
  }
  phdr_ = h;
  switch (h.op) {
    case WireOp::kSend:
    case WireOp::kSendWithImm: {
      const RecvWr& r = cur_recv_;
      if (h.length > r.length) {
        has_cur_recv_ = false;
        complete_recv(r, Opcode::kRecv, h.length, false, 0, Status::kLocalLengthError);
        const FrameResult res = reject(Status::kRemoteInvalidRequestError);
        enter_error();
        return res;
      }
      if (h.length != 0 &&
          !mrs_.check_local(r.lkey, r.addr, h.length, kAccessLocalWrite)) {
        has_cur_recv_ = false;
        complete_recv(r, Opcode::kRecv, h.length, false, 0,
                      Status::kLocalProtectionError);
        const FrameResult res = reject(Status::kRemoteOperationError);
        enter_error();
        return res;
      }
      sb_ += kHeaderSize;
      start_payload(h.length, static_cast<std::byte*>(r.addr), nullptr,
                    PayloadDone::kSend);
      return FrameResult::kConsumed;
    }
    case WireOp::kWrite:
    case WireOp::kWriteWithImm: {
      MrEntry* e = h.op == WireOp::kWriteWithImm
                       ? pinned
                       : mrs_.acquire(h.rkey, h.addr, h.length, kAccessRemoteWrite);
      if (e == nullptr && h.op == WireOp::kWrite)
        return reject(Status::kRemoteAccessError);
      sb_ += kHeaderSize;
      start_payload(
          h.length, reinterpret_cast<std::byte*>(h.addr), e,
          h.op == WireOp::kWrite ? PayloadDone::kWrite : PayloadDone::kWriteImm);
      return FrameResult::kConsumed;
    }
    case WireOp::kReadReq: {
      MrEntry* e = mrs_.acquire(h.rkey, h.addr, h.arg0, kAccessRemoteRead);
      if (e == nullptr) return reject(Status::kRemoteAccessError);
      sb_ += kHeaderSize;
      pending_ack_ = false;  // the response acknowledges everything before
      Header resp;
      resp.op = WireOp::kReadResp;
      resp.seq = h.seq;
      resp.length = static_cast<uint32_t>(h.arg0);
      TxItem& it = tx_push();
      encode_header(resp, it.hdr.data());
      // Sent straight from the region; the pin holds until it is on the wire.
      it.payload = reinterpret_cast<const std::byte*>(h.addr);
      it.payload_len = resp.length;
      it.ref = e;
      return FrameResult::kConsumed;
    }
    case WireOp::kCompareSwap:
    case WireOp::kFetchAdd: {
      if (!core::atomic_aligned(h.addr))
        return reject(Status::kRemoteInvalidRequestError);
      MrEntry* e = mrs_.acquire(h.rkey, h.addr, 8, kAccessRemoteAtomic);
      if (e == nullptr) return reject(Status::kRemoteAccessError);
      // Atomic against every other atomic on this address, whichever QP or
      // thread serves it: all targets execute on the same memory word.
      std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(h.addr));
      uint64_t old;
      if (h.op == WireOp::kFetchAdd) {
        old = word.fetch_add(h.arg0, std::memory_order_acq_rel);
      } else {
        old = h.arg0;
        word.compare_exchange_strong(old, h.arg1, std::memory_order_acq_rel);
      }
      MrTable::release(e);
      sb_ += kHeaderSize;
      pending_ack_ = false;
      queue_control(WireOp::kAtomicResp, h.seq, Status::kSuccess, old);
      return FrameResult::kConsumed;
    }
    default: protocol_error("unexpected request opcode"); return FrameResult::kFatal;
  }
}

void TcpQp::finish_payload() noexcept {
  rx_state_ = RxState::kHeader;
  const PayloadDone done = pdone_;
  MrTable::release(pref_);
  pref_ = nullptr;
  pdst_ = nullptr;
  pdone_ = PayloadDone::kDiscard;
  switch (done) {
    case PayloadDone::kDiscard: return;
    case PayloadDone::kWrite: break;
    case PayloadDone::kWriteImm:
    case PayloadDone::kSend: {
      const RecvWr r = cur_recv_;
      has_cur_recv_ = false;
      const bool imm = phdr_.op != WireOp::kSend;
      complete_recv(
          r, done == PayloadDone::kSend ? Opcode::kRecv : Opcode::kRecvWriteWithImm,
          static_cast<uint32_t>(plen_), imm, phdr_.imm, Status::kSuccess);
      break;
    }
    case PayloadDone::kReadResp:
      complete_send(phdr_.seq, Status::kSuccess);
      advance_local_errors();
      return;
  }
  pending_ack_ = true;
  ack_seq_ = phdr_.seq;
}

}  // namespace rdmakit::tcp
