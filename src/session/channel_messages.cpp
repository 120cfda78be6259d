// Messages: SEND (copied through the send ring or zero copy from a pool
// buffer) under credit flow control, delivery of received messages to the
// handler or the pull inbox, and the re-post of receive slots that returns
// credits to the peer.
#include <algorithm>
#include <cstring>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <utility>

#include "channel_core.hpp"
#include "engine.hpp"
#include "wire.hpp"

namespace rdmakit::session {

using detail::ChannelCore;
using detail::core;
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
  if (channel_ != nullptr) core(*std::exchange(channel_, nullptr)).repost(slot_);
}

// ---- sending ----

uint32_t Channel::credits() const noexcept {
  const ChannelCore& c = core(*this);
  std::lock_guard lock(c.mu_);
  if (c.peer_reposted_ == nullptr) return 0;
  const uint64_t returned = detail::load_peer_written(c.peer_reposted_);
  const uint64_t in_flight = c.sent_ - returned;
  return in_flight >= c.peer_depth_ ? 0
                                    : static_cast<uint32_t>(c.peer_depth_ - in_flight);
}

// Waits (lock released while waiting) until a credit is available. The peer
// returns credits by a one-sided WRITE into our control block, so no progress
// of ours is needed for one to arrive.
OpResult ChannelCore::wait_credit(std::unique_lock<detail::DatapathMutex>& lock) {
  // The clock is read only once there is something to wait for.
  Clock::time_point deadline{};
  for (uint32_t spins = 0;; ++spins) {
    if (closed_) return closed_result("send");
    if (peer_reposted_ == nullptr) return closed_result("send");
    const uint64_t returned = detail::load_peer_written(peer_reposted_);
    if (sent_ - returned < peer_depth_) return {};
    if (spins == 0) {
      deadline = Clock::now() + op_timeout();
    } else if (Clock::now() >= deadline) {
      return fail(Errc::kNoCredit, "send",
                  "no credit within op_timeout (" + std::to_string(op_timeout().count()) +
                      " ms): the peer has not consumed its " +
                      std::to_string(peer_depth_) + " posted receives");
    }
    lock.unlock();
    progress_or_pause(spins);
    lock.lock();
  }
}

OpResult ChannelCore::begin_send(size_t size,
                                 std::unique_lock<detail::DatapathMutex>& lock) {
  if (size > peer_max_message_) {
    return fail(Errc::kTooLarge, "send",
                std::to_string(size) + " bytes exceed the peer's max_message " +
                    std::to_string(peer_max_message_));
  }
  lock.lock();
  if (closed_) return closed_result("send");
  return wait_credit(lock);
}

OpResult Channel::send(std::span<const std::byte> message) {
  ChannelCore& c = core(*this);
  std::unique_lock lock(c.mu_, std::defer_lock);
  if (OpResult r = c.begin_send(message.size(), lock); !r.ok()) return r;
  // Credits bound unconsumed SENDs to peer_depth_, so the slot used
  // peer_depth_ sends ago has been delivered and may be overwritten.
  c.send_slot_ = c.next_slot_;
  const auto length = static_cast<uint32_t>(message.size());
  // INLINE data is copied at post time: no staging copy for small messages.
  const bool inline_data = length <= c.qp_->max_inline();
  std::byte* slot = c.send_mr_->data() +
                    size_t{c.send_slot_} * (c.peer_max_message_ + sizeof(MsgHeader));
  if (!inline_data) std::memcpy(slot, message.data(), length);
  // Copied SENDs need no completion (the slot is reused by credit, not by
  // completion): only every kSignalEvery-th is signaled, to retire the queue.
  SendWr wr{.opcode = Opcode::kSendWithImm,
            .flags = static_cast<uint8_t>((c.signal_due() ? kSignaled : 0) |
                                          (inline_data ? kInline : 0)),
            .length = length,
            .local_addr = inline_data ? const_cast<std::byte*>(message.data()) : slot,
            .lkey = inline_data ? 0 : c.send_mr_->lkey(),
            .imm = detail::kDataImm};
  OpCallback none;
  OpResult r =
      c.post_retrying(lock, wr, static_cast<uint8_t>(WrKind::kSendCopy), none, nullptr);
  if (r.ok()) c.count_sent();
  return r;
}

OpResult Channel::send(Buffer&& buffer) {
  ChannelCore& c = core(*this);
  if (!buffer) return c.fail(Errc::kInvalid, "send", "empty buffer");
  std::unique_lock lock(c.mu_, std::defer_lock);
  if (OpResult r = c.begin_send(buffer.size(), lock); !r.ok()) return r;
  // The header goes into the buffer's headroom, in front of data().
  std::byte* base = buffer.data() - Buffer::kHeadroomBytes;
  const MsgHeader header{detail::kMagic, static_cast<uint16_t>(MsgKind::kData), 0,
                         buffer.size()};
  std::memcpy(base, &header, sizeof header);
  SendWr wr{.opcode = Opcode::kSend,
            .flags = kSignaled,
            .length = static_cast<uint32_t>(sizeof header + buffer.size()),
            .local_addr = base,
            .lkey = buffer.lkey()};
  OpCallback none;
  OpResult r = c.post_retrying(lock, wr, static_cast<uint8_t>(WrKind::kSendZeroCopy),
                               none, &buffer);
  if (r.ok()) c.count_sent();
  return r;
}

bool ChannelCore::send_control(MsgKind kind, std::span<const std::byte> payload,
                               uint64_t* wr_id) {
  std::lock_guard lock(mu_);
  if (closed_ || qp_ == nullptr || payload.size() > peer_max_message_) return false;
  const uint64_t returned = detail::load_peer_written(peer_reposted_);
  if (sent_ - returned >= peer_depth_) return false;
  send_slot_ = next_slot_;
  std::byte* slot =
      send_mr_->data() + size_t{send_slot_} * (peer_max_message_ + sizeof(MsgHeader));
  const MsgHeader header{detail::kMagic, static_cast<uint16_t>(kind), 0, payload.size()};
  std::memcpy(slot, &header, sizeof header);
  if (!payload.empty()) std::memcpy(slot + sizeof header, payload.data(), payload.size());
  SendWr wr{.opcode = Opcode::kSend,
            .flags = kSignaled,
            .length = static_cast<uint32_t>(sizeof header + payload.size()),
            .local_addr = slot,
            .lkey = send_mr_->lkey()};
  OpCallback none;
  if (!post_locked(wr, static_cast<uint8_t>(WrKind::kSendCopy), none, nullptr).ok()) {
    return false;
  }
  if (wr_id != nullptr) *wr_id = wr.wr_id;
  count_sent();
  return true;
}

// ---- receiving ----

// A RECV completed successfully (worker thread).
void ChannelCore::on_recv(const Completion& c) {
  const uint32_t slot = detail::wr_index(c.wr_id);
  detail::Delivery lent{.channel = this, .slot = slot};
  if (c.opcode == Opcode::kRecvWriteWithImm) {
    lent.notification = true;
    lent.imm = c.imm;
    lent.written = c.byte_len;
  } else if (c.has_imm() && c.imm == detail::kDataImm) {
    lent.data = recv_mr_->data() + size_t{slot} * slot_size_;
    lent.size = c.byte_len;
  } else {
    const std::byte* base = recv_mr_->data() + size_t{slot} * slot_size_;
    MsgHeader header{};
    if (c.byte_len >= sizeof header) std::memcpy(&header, base, sizeof header);
    if (c.byte_len < sizeof header || header.magic != detail::kMagic ||
        header.length != c.byte_len - sizeof header) {
      repost(slot);
      endpoint_->worker_->fail_endpoint(*endpoint_, DisconnectReason::kTransportError,
                                        "malformed message on channel '" + name_ + "' (" +
                                            std::to_string(c.byte_len) + " bytes)");
      return;
    }
    lent.data = base + sizeof header;
    lent.size = header.length;
    const auto kind = static_cast<MsgKind>(header.kind);
    if (kind != MsgKind::kData) {
      const Message m(lent);
      endpoint_->worker_->on_control(*endpoint_, kind, m.data());
      return;  // m re-posts the slot
    }
  }
  Message m(lent);
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
  const rdmakit::detail::ConditionalLock lock(inbox_mu_, mu_.shared());
  if (inbox_count_ == inbox_.size()) return;  // cannot happen: one slot per RECV
  size_t tail = inbox_head_ + inbox_count_;
  if (tail >= inbox_.size()) tail -= inbox_.size();
  inbox_[tail] = std::move(m);
  ++inbox_count_;
  if (mu_.shared()) inbox_cv_.notify_one();
}

OpResult Channel::recv(Message* out, std::chrono::milliseconds timeout) {
  ChannelCore& c = core(*this);
  if (c.handler_mode_) {
    return c.fail(Errc::kInvalid, "recv", "messages go to the on_message handler");
  }
  if (c.app_progress_) return c.recv_progressing(out, timeout);
  std::unique_lock lock(c.inbox_mu_);
  // The clock is read only once there is something to wait for.
  Clock::time_point deadline{};
  if (c.inbox_count_ == 0) deadline = Clock::now() + timeout;
  while (c.inbox_count_ == 0) {
    if (c.inbox_closed_) return c.closed_result("recv");
    if (Clock::now() >= deadline) {
      return c.fail(Errc::kTimeout, "recv",
                    "no message within " + std::to_string(timeout.count()) + " ms");
    }
    c.inbox_cv_.wait_until(lock, deadline);
  }
  *out = c.pop_inbox();
  return {};
}

// Without library threads the caller is the progress thread: it polls for
// the message itself, with no lock (the channel has one owner), and the
// completion path hands the message straight to it (no inbox). A reply that
// is on its way arrives within a few passes, which read no clock.
OpResult ChannelCore::recv_progressing(Message* out, std::chrono::milliseconds timeout) {
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

Message ChannelCore::pop_inbox() noexcept {
  Message m = std::move(inbox_[inbox_head_]);
  inbox_head_ = inbox_head_ + 1 == inbox_.size() ? 0 : inbox_head_ + 1;
  --inbox_count_;
  return m;
}

// ---- returning receive slots (and credits) ----

// Re-posts a receive slot and returns credits to the peer in batches of half
// the depth (a sender that ran out has depth unreported re-posts pending here,
// so a batch is always due before it could stall).
void ChannelCore::repost(uint32_t slot) noexcept {
  std::lock_guard lock(mu_);
  if (closed_) return;
  const RecvWr wr{.wr_id = wr_id_for(WrKind::kRecv, slot),
                  .addr = recv_mr_->data() + size_t{slot} * slot_size_,
                  .length = slot_size_,
                  .lkey = recv_mr_->lkey()};
  if (!qp_->post_recv(wr).ok()) return;  // QP in error: the worker closes the endpoint
  ++reposted_;
  if (reposted_ - reported_ >= std::max<uint32_t>(1, depth_ / 2)) report_credits_locked();
}

void ChannelCore::report_credits_locked() noexcept {
  // Not before the peer's table told us where its control block is; a
  // later re-post reports the total.
  if (endpoint_->peer_ctrl_.rkey == 0 && endpoint_->peer_ctrl_.addr == 0) return;
  const uint64_t value = reposted_;
  SendWr wr{.wr_id = wr_id_for(WrKind::kInternal, 0),
            .opcode = Opcode::kWrite,
            .flags = kSignaled | kInline,
            .length = sizeof value,
            .local_addr = const_cast<uint64_t*>(&value),
            .remote_addr =
                endpoint_->peer_ctrl_.addr_at(detail::kCtrlCredits + size_t{8} * index_),
            .rkey = endpoint_->peer_ctrl_.rkey};
  if (qp_->post_send(wr).ok()) reported_ = value;
}

}  // namespace rdmakit::session
