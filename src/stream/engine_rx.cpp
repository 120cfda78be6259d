// The receive side: the CQ drained and each completion dispatched to its
// stream (send completions free the send buffer; receives are checked
// against the protocol, records placed in the ring), and the consumed
// receives re-posted.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <span>

#include "stream/engine.hpp"

namespace rdmakit::stream::detail {

void EngineImpl::drain() noexcept {
  // batch_ is a member: a local array of Completions would be initialized
  // (2 KiB of stores) on every poll of a spinning reader.
  for (;;) {
    const int n = cq->poll(batch_);
    for (int i = 0; i < n; ++i) dispatch(batch_[static_cast<size_t>(i)]);
    if (n < static_cast<int>(batch_.size())) return;
  }
}

void EngineImpl::dispatch(const Completion& c) noexcept {
  const uint32_t slot = wr_slot(c.wr_id);
  if (slot >= slots_.size() || !slots_[slot] || slots_[slot]->gen() != wr_gen(c.wr_id))
    return;
  // Only a closed stream can be finalized (dropped from its slot) below: hold
  // a reference then, and spare the atomic count on every other completion.
  std::shared_ptr<StreamCore> keep;
  if (slots_[slot]->closed()) keep = slots_[slot];
  StreamCore& s = *slots_[slot];
  const uint64_t kind = wr_kind(c.wr_id);
  if (kind == kWrSend) {
    s.retire_sends(c.wr_id, c.ok());
    if (!c.ok()) s.fail(ECONNRESET, c.status);
  } else if (kind == kWrRecv) {
    if (c.status == Status::kLocalLengthError && s.error() == 0) {
      // A SEND larger than the record buffers: no honest peer sends one.
      std::fprintf(stderr,
                   "rdmakit stream: protocol violation from %s (%s): a record larger "
                   "than %u bytes (%s); stream reset\n",
                   s.peer().c_str(), ctx->provider_name(), wire::kRecordData,
                   status_name(c.status));
      s.fail(EPROTO, c.status);
    } else if (!c.ok()) {
      // After the peer's FIN its QP may go away: that is its close, not an error.
      if (!s.fin_received()) s.fail(ECONNRESET, c.status);
    } else {
      on_recv(s, c);
    }
  }
  pump(s);
  s.update();
  maybe_finalize(s);
}

void EngineImpl::on_recv(StreamCore& s, const Completion& c) noexcept {
  // A send may fail (the peer closed and left) while its last data and FIN
  // still wait in our completion queue: those are still delivered. Only a
  // peer that broke the protocol is not listened to any more.
  if (s.error() == EPROTO) return;
  if (s.accept_message(c) != wire::Flow::Result::kOk) {
    std::fprintf(
        stderr,
        "rdmakit stream: protocol violation from %s (%s): %s imm 0x%08x byte_len %u; "
        "stream reset\n",
        s.peer().c_str(), ctx->provider_name(),
        c.opcode == Opcode::kRecv ? "record" : "ring write", c.imm, c.byte_len);
    s.fail(EPROTO, Status::kSuccess);
    return;
  }
  // Re-posted only now: the buffer of this receive was read above.
  if (s.count_consumed_receive() && !flush_reposts(s)) return;
  if (s.rst_received()) s.fail(ECONNRESET, Status::kSuccess);
  s.discard_if_read_shut();
}

bool EngineImpl::flush_reposts(StreamCore& s) noexcept {
  if (s.repost_receives()) return true;
  s.fail(ECONNRESET, Status::kGeneralError);
  return false;
}

wire::Flow::Result StreamCore::accept_message(const Completion& c) noexcept {
  ++rx_msgs_;  // the timers turn counts into times: no clock read per message
  const bool record = c.opcode == Opcode::kRecv;
  if (!c.has_imm() || (!record && c.opcode != Opcode::kRecvWriteWithImm) ||
      flow_.on_message(c.imm, c.byte_len, record) != wire::Flow::Result::kOk)
    return wire::Flow::Result::kViolation;
  if (record) {
    // The buffer index is our own (wr_id); on_message bounded the length.
    const uint32_t idx = wr_bytes(c.wr_id) % opt.recv_credits;
    // on_message advanced rx_written past this record (after a rewind, if any).
    const uint64_t at = flow_.rx_written - c.byte_len;
    wire::place_record(rx_->data(), flow_.rx_size, at,
                       rec_buf_.get() + static_cast<size_t>(idx) * wire::kRecordStride,
                       c.byte_len);
  }
  return wire::Flow::Result::kOk;
}

bool StreamCore::repost_receives() noexcept {
  if (repost_pending_ == 0 || !qp_) return true;
  std::array<RecvWr, kMaxRepostBatch> again;
  const uint32_t n = std::min(repost_pending_, kMaxRepostBatch);
  for (uint32_t i = 0; i < n; ++i)
    again[i] = record_recv(static_cast<uint32_t>((recv_posted_ + i) % opt.recv_credits));
  const PostResult r = qp_->post_recv(std::span<const RecvWr>(again.data(), n));
  if (!r.ok() || r.posted != n) return false;
  recv_posted_ += n;
  repost_pending_ -= n;
  flow_.rx_unreported += n;
  return true;
}

}  // namespace rdmakit::stream::detail
