// Messages: SEND (copied through the send ring or zero copy from a pool
// buffer) under credit flow control, delivery of received messages to the
// handler or the pull inbox, and the re-post of receive slots that returns
// credits to the peer.
#include <algorithm>
#include <cstring>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <utility>

#include "engine.hpp"
#include "wire.hpp"

namespace rdmakit::session {

using detail::make_wr_id;
using detail::MsgHeader;
using detail::MsgKind;
using detail::WrKind;
using Clock = std::chrono::steady_clock;

Message& Message::operator=(Message&& other) noexcept {
  if (this != &other) {
    release();
    channel_ = std::exchange(other.channel_, nullptr);
    data_ = other.data_;
    size_ = other.size_;
    slot_ = other.slot_;
    imm_ = other.imm_;
    written_ = other.written_;
    notification_ = other.notification_;
  }
  return *this;
}

void Message::release() noexcept {
  if (channel_ != nullptr) std::exchange(channel_, nullptr)->repost(slot_);
}

uint32_t Channel::credits() const noexcept {
  std::lock_guard lock(mu_);
  if (peer_reposted_ == nullptr) return 0;
  const uint64_t returned = detail::load_peer_written(peer_reposted_);
  const uint64_t in_flight = sent_ - returned;
  return in_flight >= peer_depth_ ? 0 : static_cast<uint32_t>(peer_depth_ - in_flight);
}

// Waits (lock released while waiting) until a credit is available. The peer
// returns credits by a one-sided WRITE into our control block, so no progress
// of ours is needed for one to arrive.
OpResult Channel::wait_credit(std::unique_lock<detail::DatapathMutex>& lock) {
  // The clock is read only once there is something to wait for.
  Clock::time_point deadline{};
  for (uint32_t spins = 0;; ++spins) {
    if (closed_) return closed_result("send");
    if (peer_reposted_ == nullptr) return closed_result("send");
    const uint64_t returned = detail::load_peer_written(peer_reposted_);
    if (sent_ - returned < peer_depth_) return {};
    if (spins == 0) {
      deadline = Clock::now() + endpoint_->engine_->options().op_timeout;
    } else if (Clock::now() >= deadline) {
      return fail(Errc::kNoCredit, "send",
                  "no credit within op_timeout (" +
                      std::to_string(endpoint_->engine_->options().op_timeout.count()) +
                      " ms): the peer has not consumed its " +
                      std::to_string(peer_depth_) + " posted receives");
    }
    lock.unlock();
    progress_or_pause(spins);
    lock.lock();
  }
}

OpResult Channel::send(std::span<const std::byte> message) {
  if (message.size() > peer_max_message_) {
    return fail(Errc::kTooLarge, "send",
                std::to_string(message.size()) + " bytes exceed the peer's max_message " +
                    std::to_string(peer_max_message_));
  }
  std::unique_lock lock(mu_);
  if (closed_) return closed_result("send");
  if (OpResult r = wait_credit(lock); !r.ok()) return r;
  // Credits bound unconsumed SENDs to peer_depth_, so the slot used
  // peer_depth_ sends ago has been delivered and may be overwritten.
  send_slot_ = next_slot_;
  const auto length = static_cast<uint32_t>(message.size());
  // INLINE data is copied at post time: no staging copy for small messages.
  const bool inline_data = length <= qp_->max_inline();
  std::byte* slot =
      send_mr_->data() + size_t{send_slot_} * (peer_max_message_ + sizeof(MsgHeader));
  if (!inline_data) std::memcpy(slot, message.data(), length);
  // Copied SENDs need no completion (the slot is reused by credit, not by
  // completion): only every kSignalEvery-th is signaled, to retire the queue.
  SendWr wr{.opcode = Opcode::kSendWithImm,
            .flags = static_cast<uint8_t>((signal_due() ? kSignaled : 0) |
                                          (inline_data ? kInline : 0)),
            .length = length,
            .local_addr = inline_data ? const_cast<std::byte*>(message.data()) : slot,
            .lkey = inline_data ? 0 : send_mr_->lkey(),
            .imm = detail::kDataImm};
  OpCallback none;
  OpResult r =
      post_retrying(lock, wr, static_cast<uint8_t>(WrKind::kSendCopy), none, nullptr);
  if (r.ok()) count_sent();
  return r;
}

OpResult Channel::send(Buffer&& buffer) {
  if (!buffer) return fail(Errc::kInvalid, "send", "empty buffer");
  if (buffer.size() > peer_max_message_) {
    return fail(Errc::kTooLarge, "send",
                std::to_string(buffer.size()) + " bytes exceed the peer's max_message " +
                    std::to_string(peer_max_message_));
  }
  std::unique_lock lock(mu_);
  if (closed_) return closed_result("send");
  if (OpResult r = wait_credit(lock); !r.ok()) return r;
  const MsgHeader header{detail::kMagic, static_cast<uint16_t>(MsgKind::kData), 0,
                         buffer.size()};
  std::memcpy(buffer.base(), &header, sizeof header);
  SendWr wr{.opcode = Opcode::kSend,
            .flags = kSignaled,
            .length = static_cast<uint32_t>(sizeof header + buffer.size()),
            .local_addr = buffer.base(),
            .lkey = buffer.lkey()};
  OpCallback none;
  OpResult r =
      post_retrying(lock, wr, static_cast<uint8_t>(WrKind::kSendZeroCopy), none, &buffer);
  if (r.ok()) count_sent();
  return r;
}

Message Channel::pop_inbox() noexcept {
  Message m = std::move(inbox_[inbox_head_]);
  inbox_head_ = inbox_head_ + 1 == inbox_.size() ? 0 : inbox_head_ + 1;
  --inbox_count_;
  return m;
}

OpResult Channel::recv(Message* out, std::chrono::milliseconds timeout) {
  if (handler_mode_) {
    return fail(Errc::kInvalid, "recv", "messages go to the on_message handler");
  }
  if (app_progress_) return recv_progressing(out, timeout);
  std::unique_lock lock(inbox_mu_);
  // The clock is read only once there is something to wait for.
  Clock::time_point deadline{};
  if (inbox_count_ == 0) deadline = Clock::now() + timeout;
  while (inbox_count_ == 0) {
    if (inbox_closed_) return closed_result("recv");
    if (Clock::now() >= deadline) {
      return fail(Errc::kTimeout, "recv",
                  "no message within " + std::to_string(timeout.count()) + " ms");
    }
    inbox_cv_.wait_until(lock, deadline);
  }
  *out = pop_inbox();
  return {};
}

// Without library threads the caller is the progress thread: it polls for
// the message itself, with no lock (the channel has one owner), and the
// completion path hands the message straight to it (no inbox). A reply that
// is on its way arrives within a few passes, which read no clock.
OpResult Channel::recv_progressing(Message* out, std::chrono::milliseconds timeout) {
  if (inbox_count_ != 0) {
    *out = pop_inbox();
    return {};
  }
  detail::Worker* worker = endpoint_->worker_;
  // The message that arrives while we poll goes straight into *out. A recv()
  // nested in a handler (on_disconnect) restores the outer one's on return.
  struct Waiting {
    Message*& slot;
    Message* outer;
    ~Waiting() { slot = outer; }
  } waiting{waiting_, waiting_};
  waiting_ = out;
  constexpr uint32_t kClocklessPasses = 64;
  for (uint32_t pass = 0; waiting_ == out && pass < kClocklessPasses; ++pass) {
    if (inbox_closed_ || worker == nullptr) return closed_result("recv");
    worker->poll_pass();
  }
  if (waiting_ == out) {
    const Clock::time_point deadline = Clock::now() + timeout;
    while (waiting_ == out) {
      if (inbox_closed_) return closed_result("recv");
      const auto now = Clock::now();
      if (now >= deadline) {
        return fail(Errc::kTimeout, "recv",
                    "no message within " + std::to_string(timeout.count()) + " ms");
      }
      worker->run_once(
          std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                   std::chrono::milliseconds(10)));
    }
  }
  return {};
}

// Re-posts a receive slot and returns credits to the peer in batches of half
// the depth (a sender that ran out has depth unreported re-posts pending here,
// so a batch is always due before it could stall).
void Channel::repost(uint32_t slot) noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  const RecvWr wr{.wr_id = make_wr_id(endpoint_->slot_, endpoint_->generation_, index_,
                                      WrKind::kRecv, slot),
                  .addr = recv_mr_->data() + size_t{slot} * slot_size_,
                  .length = slot_size_,
                  .lkey = recv_mr_->lkey()};
  if (!qp_->post_recv(wr).ok()) return;  // QP in error: the worker closes the endpoint
  ++reposted_;
  if (reposted_ - reported_ >= std::max<uint32_t>(1, depth_ / 2)) report_credits_locked();
}

void Channel::report_credits_locked() noexcept {
  // Not before the peer's table told us where its control block is; a
  // later re-post reports the total.
  if (endpoint_->peer_ctrl_.rkey == 0 && endpoint_->peer_ctrl_.addr == 0) return;
  const uint64_t value = reposted_;
  SendWr wr{.wr_id = make_wr_id(endpoint_->slot_, endpoint_->generation_, index_,
                                WrKind::kInternal, 0),
            .opcode = Opcode::kWrite,
            .flags = kSignaled | kInline,
            .length = sizeof value,
            .local_addr = const_cast<uint64_t*>(&value),
            .remote_addr =
                endpoint_->peer_ctrl_.addr_at(detail::kCtrlCredits + size_t{8} * index_),
            .rkey = endpoint_->peer_ctrl_.rkey};
  if (qp_->post_send(wr).ok()) reported_ = value;
}

// A RECV completed successfully (worker thread).
void Channel::on_recv(const Completion& c) {
  const uint32_t slot = detail::wr_index(c.wr_id);
  Message m;
  m.channel_ = this;
  m.slot_ = slot;
  if (c.opcode == Opcode::kRecvWriteWithImm) {
    m.notification_ = true;
    m.imm_ = c.imm;
    m.written_ = c.byte_len;
  } else if (c.has_imm() && c.imm == detail::kDataImm) {
    m.data_ = recv_mr_->data() + size_t{slot} * slot_size_;
    m.size_ = c.byte_len;
  } else {
    const std::byte* base = recv_mr_->data() + size_t{slot} * slot_size_;
    MsgHeader header{};
    if (c.byte_len >= sizeof header) std::memcpy(&header, base, sizeof header);
    if (c.byte_len < sizeof header || header.magic != detail::kMagic ||
        header.length != c.byte_len - sizeof header) {
      m.release();
      endpoint_->worker_->fail_endpoint(*endpoint_, DisconnectReason::kTransportError,
                                        "malformed message on channel '" + name_ + "' (" +
                                            std::to_string(c.byte_len) + " bytes)");
      return;
    }
    m.data_ = base + sizeof header;
    m.size_ = header.length;
    const auto kind = static_cast<MsgKind>(header.kind);
    if (kind != MsgKind::kData) {
      endpoint_->worker_->on_control(*endpoint_, kind, m.data());
      return;  // m re-posts the slot
    }
  }
  if (handler_mode_) {
    endpoint_->engine_->handlers().on_message(*this, m);
    return;
  }
  if (waiting_ != nullptr) {
    // Only set in kApplication mode, and only while the inbox is empty (a
    // recv() takes from the inbox first), so the order is kept.
    *waiting_ = std::move(m);  // releases what *waiting_ held, as pop_inbox's move did
    waiting_ = nullptr;
    return;
  }
  std::unique_lock lock(inbox_mu_, std::defer_lock);
  if (mu_.shared()) lock.lock();
  if (inbox_count_ == inbox_.size()) return;  // cannot happen: one slot per RECV
  size_t tail = inbox_head_ + inbox_count_;
  if (tail >= inbox_.size()) tail -= inbox_.size();
  inbox_[tail] = std::move(m);
  ++inbox_count_;
  if (mu_.shared()) inbox_cv_.notify_one();
}

}  // namespace rdmakit::session
