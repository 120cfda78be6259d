// The send side: pump posts what a stream may send now (queued data, a
// CREDIT, the FIN), and the control messages themselves (CREDIT, FIN,
// KEEPALIVE, RST). DATA is posted by StreamCore::post_data
// (stream_core.hpp), which the writer's inline fast path shares.
#include <cerrno>

#include "stream/engine.hpp"

namespace rdmakit::stream::detail {

void EngineImpl::pump(StreamCore& s) noexcept {
  if (s.rst_pending()) {  // an abort waits for a message credit, nothing else goes
    s.send_rst();
    return;
  }
  if (s.error() != 0 || !s.has_qp()) return;
  while (s.send_queued() && s.can_post_data()) {
    const StreamCore::DataTarget at = s.data_target();
    if (at.room == 0) break;
    const PostResult r =
        s.post_data(at, StreamCore::DataKind::kBuffered, nullptr, s.buffered_chunk(at));
    if (!r.ok()) {
      if (r.status == PostStatus::kQueueFull) break;
      s.fail(ECONNRESET, Status::kGeneralError);
      return;
    }
  }
  if (s.credit_due()) (void)s.send_credit();
  if (s.fin_due()) (void)s.send_fin();
}

bool StreamCore::post_control(uint32_t imm) noexcept {
  if (sends_outstanding_ >= send_depth_ || flow_.msg_credits == 0) return false;
  SendWr wr;
  wr.wr_id = make_wr_id(slot_, gen_, kWrSend, 0, unsignaled_ + 1);
  wr.opcode = Opcode::kWriteWithImm;
  wr.flags = kSignaled;
  wr.length = 0;
  wr.imm = imm;
  wr.remote_addr = peer_ring_.addr;
  wr.rkey = peer_ring_.rkey;
  if (!qp_->post_send(wr).ok()) return false;
  unsignaled_ = 0;
  --flow_.msg_credits;
  ++sends_outstanding_;
  ++tx_msgs_;
  return true;
}

bool StreamCore::credit_due() const noexcept {
  // Half the ring read or half the message credits to report, or an empty
  // ring the writer should learn of so that it rewinds.
  const uint64_t unacked = flow_.rx_read - flow_.rx_acked;
  return (unacked >= flow_.rx_size / 2 || flow_.rx_unreported >= opt.recv_credits / 2 ||
          flow_.empty_credit_due()) &&
         flow_.msg_credits >= wire::kCreditReserve;
}

bool StreamCore::send_credit() noexcept {
  const uint64_t unacked = flow_.rx_read - flow_.rx_acked;
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(
          wire::encode(wire::Op::kCredit, msgs, static_cast<uint32_t>(unacked))))
    return false;
  flow_.rx_unreported -= msgs;
  flow_.rx_acked += unacked;
  return true;
}

bool StreamCore::send_fin() noexcept {
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(wire::encode(wire::Op::kCtrl, msgs, wire::kFin))) return false;
  flow_.rx_unreported -= msgs;
  fin_sent_ = true;
  return true;
}

bool StreamCore::send_keepalive() noexcept {
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(wire::encode(wire::Op::kCtrl, msgs, wire::kKeepalive))) return false;
  flow_.rx_unreported -= msgs;
  return true;
}

void StreamCore::send_rst() noexcept {
  rst_pending_ = false;
  // A stream that already failed needs no RST: the peer reset it, is gone, or
  // was told by fail().
  if (err_ != 0 || !qp_) return;
  if (!post_control(wire::encode(wire::Op::kCtrl, 0, wire::kRst))) {
    rst_pending_ = true;  // no credit or send slot: pump() retries
    return;
  }
  err_ = ECONNRESET;
  err_status_ = Status::kSuccess;
}

}  // namespace rdmakit::stream::detail
