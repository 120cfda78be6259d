// Over 600 lines on purpose: one concept, a channel, whose post paths (send,
// one-sided, batches, credits) and completion paths share its private state and
// the small inline helpers of the send path; split, they would need friends.
#include <array>
#include <condition_variable>
#include <cstring>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <thread>
#include <utility>

#include "engine.hpp"
#include "fmt/format.h"
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

Channel::Channel(Endpoint* endpoint, uint32_t index, std::string name)
    : endpoint_(endpoint), index_(index), name_(std::move(name)) {}

Channel::~Channel() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    qp_.reset();
  }
  inbox_.clear();
}

void Channel::release_memory() {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.clear();
    inbox_count_ = 0;
  }
  std::lock_guard lock(mu_);
  closed_ = true;
  peer_reposted_ = nullptr;
  recv_mr_.reset();
  send_mr_.reset();
}

OpResult Channel::fail(Errc code, const char* what, const std::string& why) const {
  OpResult r;
  r.code = code;
  r.status = Status::kGeneralError;
  r.detail = std::string(what) + " on channel '" + name_ + "' to " + endpoint_->peer() +
             " (" + endpoint_->provider_name() + "): " + why;
  return r;
}

OpResult Channel::closed_result(const char* what) const {
  const DisconnectInfo info = endpoint_->disconnect_info();
  OpResult r =
      fail(Errc::kClosed, what,
           std::string("endpoint closed (") + disconnect_reason_name(info.reason) +
               (info.detail.empty() ? "" : ": " + info.detail) + ")");
  r.status = Status::kWrFlushError;
  return r;
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

// While waiting for a credit or a send-queue slot: on the progress thread
// (or in application mode) the wait runs the progress loop, since what we
// wait for may need our own completions polled or messages consumed (handlers
// may run nested); on other threads it yields, then sleeps briefly.
void Channel::progress_or_pause(uint32_t spins) {
  detail::Worker* worker = endpoint_->worker_;
  if (worker != nullptr && (app_progress_ || worker->on_worker_thread())) {
    worker->run_once(std::chrono::milliseconds(0));
  } else if (spins < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

OpResult Channel::post_retrying(std::unique_lock<detail::DatapathMutex>& lock, SendWr& wr,
                                uint8_t kind, OpCallback& done, Buffer* buffer) {
  Clock::time_point deadline{};
  for (uint32_t spins = 0;; ++spins) {
    OpResult r = post_locked(wr, kind, done, buffer);
    if (r.code != Errc::kQueueFull) return r;
    if (spins == 0) {
      deadline = Clock::now() + endpoint_->engine_->options().op_timeout;
    } else if (Clock::now() >= deadline) {
      return r;
    }
    lock.unlock();
    progress_or_pause(spins);
    lock.lock();
    if (closed_) return closed_result(opcode_name(wr.opcode));
  }
}

OpResult Channel::post_locked(SendWr& wr, uint8_t kind, OpCallback& done,
                              Buffer* buffer) {
  const auto k = static_cast<WrKind>(kind);
  uint32_t index = 0;
  Pending* entry = nullptr;
  if (k == WrKind::kOp || k == WrKind::kSendZeroCopy) {
    index = next_pending_ % static_cast<uint32_t>(pending_.size());
    entry = &pending_[index];
    if (entry->busy) {
      return fail(Errc::kQueueFull, opcode_name(wr.opcode),
                  std::to_string(pending_.size()) + " operations outstanding");
    }
  } else if (k == WrKind::kSendCopy) {
    index = send_slot_;
  }
  wr.wr_id = make_wr_id(endpoint_->slot_, endpoint_->generation_, index_, k, index);
  const PostResult pr = qp_->post_send(wr);
  if (pr.ok()) {
    if ((wr.flags & kSignaled) != 0) {
      unsignaled_ = 0;
    } else {
      ++unsignaled_;
    }
  }
  if (!pr.ok()) {
    return fail(pr.status == PostStatus::kQueueFull ? Errc::kQueueFull : Errc::kInvalid,
                opcode_name(wr.opcode),
                std::string("post failed: ") + post_status_name(pr.status));
  }
  if (entry != nullptr) {
    ++next_pending_;
    entry->busy = true;
    entry->kind = kind;
    entry->opcode = wr.opcode;
    entry->done = std::move(done);
    if (buffer != nullptr) entry->buffer = std::move(*buffer);
  }
  return {};
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

RemoteBuffer Channel::remote(std::string_view name) const noexcept {
  RemoteBuffer handle;
  for (const auto& [n, region] : endpoint_->remote_buffers()) {
    if (n == name) {
      handle.region_ = region;
      handle.name_ = &n;
      break;
    }
  }
  return handle;
}

OpResult Channel::resolve(std::string_view name, RemoteBuffer* out) const {
  *out = remote(name);
  if (*out) return {};
  std::string names;
  for (const auto& [n, r] : endpoint_->remote_buffers()) {
    names += names.empty() ? "" : ", ";
    names += fmt::format("'{}'", n);
  }
  return fail(Errc::kNoSuchBuffer, "resolve",
              fmt::format("the peer exposes no buffer named '{}' (it exposes: {})", name,
                          names.empty() ? "none" : names));
}

bool Channel::signal_due() noexcept { return unsignaled_ + 1 >= detail::kSignalEvery; }

OpResult Channel::one_sided(Opcode opcode, std::string_view remote, uint64_t offset,
                            Local local, size_t length, uint32_t imm, OpCallback done) {
  RemoteBuffer handle;
  if (OpResult r = resolve(remote, &handle); !r.ok()) {
    r.detail.replace(0, std::string_view("resolve").size(), opcode_name(opcode));
    return r;
  }
  return one_sided(opcode, handle, offset, local, length, imm, std::move(done));
}

OpResult Channel::one_sided(Opcode opcode, const RemoteBuffer& remote, uint64_t offset,
                            Local local, size_t length, uint32_t imm, OpCallback done) {
  const char* what = opcode_name(opcode);
  if (!remote) {
    return fail(Errc::kNoSuchBuffer, what,
                "the remote buffer handle is empty (unresolved)");
  }
  const RemoteRegion* region = &remote.region_;
  if (offset > region->length || length > region->length - offset) {
    return fail(Errc::kOutOfRange, what,
                fmt::format("[{}, +{}) is outside the peer's buffer '{}' of {} bytes",
                            offset, length, remote.name(), region->length));
  }
  if (local.addr == nullptr || length > local.length || length > UINT32_MAX) {
    return fail(Errc::kOutOfRange, what,
                std::to_string(length) + " bytes do not fit the local buffer of " +
                    std::to_string(local.length) + " bytes");
  }
  std::unique_lock lock(mu_);
  if (closed_) return closed_result(what);
  if (opcode == Opcode::kWriteWithImm) {
    if (OpResult r = wait_credit(lock); !r.ok()) return r;
  }
  // Without a callback nobody waits for the completion: selectively signaled.
  const bool quiet = !done;
  SendWr wr{.opcode = opcode,
            .flags = static_cast<uint8_t>(!quiet || signal_due() ? kSignaled : 0),
            .length = static_cast<uint32_t>(length),
            .local_addr = local.addr,
            .lkey = local.lkey,
            .imm = imm,
            .remote_addr = region->addr_at(offset),
            .rkey = region->rkey};
  OpResult r = post_retrying(lock, wr,
                             static_cast<uint8_t>(quiet ? WrKind::kOpQuiet : WrKind::kOp),
                             done, nullptr);
  if (r.ok() && opcode == Opcode::kWriteWithImm) count_sent();
  return r;
}

OpResult Channel::write(std::string_view remote, uint64_t offset, Local src,
                        size_t length, OpCallback done) {
  return one_sided(Opcode::kWrite, remote, offset, src, length, 0, std::move(done));
}
OpResult Channel::read(std::string_view remote, uint64_t offset, Local dst, size_t length,
                       OpCallback done) {
  return one_sided(Opcode::kRead, remote, offset, dst, length, 0, std::move(done));
}
OpResult Channel::write_with_imm(std::string_view remote, uint64_t offset, Local src,
                                 size_t length, uint32_t imm, OpCallback done) {
  return one_sided(Opcode::kWriteWithImm, remote, offset, src, length, imm,
                   std::move(done));
}
OpResult Channel::write(const RemoteBuffer& remote, uint64_t offset, Local src,
                        size_t length, OpCallback done) {
  return one_sided(Opcode::kWrite, remote, offset, src, length, 0, std::move(done));
}
OpResult Channel::read(const RemoteBuffer& remote, uint64_t offset, Local dst,
                       size_t length, OpCallback done) {
  return one_sided(Opcode::kRead, remote, offset, dst, length, 0, std::move(done));
}
OpResult Channel::write_with_imm(const RemoteBuffer& remote, uint64_t offset, Local src,
                                 size_t length, uint32_t imm, OpCallback done) {
  return one_sided(Opcode::kWriteWithImm, remote, offset, src, length, imm,
                   std::move(done));
}

OpResult Channel::write_batch(const RemoteBuffer& remote,
                              std::span<const WriteSegment> segments, OpCallback done) {
  const char* what = "WRITE";
  if (!remote) {
    return fail(Errc::kNoSuchBuffer, what,
                "the remote buffer handle is empty (unresolved)");
  }
  const RemoteRegion& region = remote.region_;
  for (const WriteSegment& s : segments) {
    if (s.offset > region.length || s.length > region.length - s.offset) {
      return fail(Errc::kOutOfRange, what,
                  fmt::format("[{}, +{}) is outside the peer's buffer '{}' of {} bytes",
                              s.offset, s.length, remote.name(), region.length));
    }
    if (s.src.addr == nullptr || s.length > s.src.length || s.length > UINT32_MAX) {
      return fail(Errc::kOutOfRange, what,
                  std::to_string(s.length) + " bytes do not fit the local buffer of " +
                      std::to_string(s.src.length) + " bytes");
    }
  }
  if (segments.empty()) {
    if (done) done(OpResult{});
    return {};
  }
  // Posted in lists of up to kList; only the very last WR carries `done`.
  constexpr size_t kList = 32;
  const bool with_callback = static_cast<bool>(done);
  std::array<SendWr, kList> wrs;
  std::unique_lock lock(mu_);
  Clock::time_point deadline{};
  size_t next = 0;
  for (uint32_t spins = 0; next < segments.size();) {
    if (closed_) return closed_result(what);
    const size_t n = std::min(kList, segments.size() - next);
    const bool has_last = next + n == segments.size();
    Pending* entry = nullptr;
    uint32_t entry_index = 0;
    if (has_last && with_callback) {
      entry_index = next_pending_ % static_cast<uint32_t>(pending_.size());
      entry = &pending_[entry_index];
    }
    OpResult blocked;
    size_t posted = 0;
    if (entry != nullptr && entry->busy) {
      blocked = fail(Errc::kQueueFull, what,
                     std::to_string(pending_.size()) + " operations outstanding");
    } else {
      uint32_t unsignaled = unsignaled_;
      for (size_t i = 0; i < n; ++i) {
        const WriteSegment& s = segments[next + i];
        const bool with_done = entry != nullptr && i + 1 == n;
        const bool signaled = with_done || unsignaled + 1 >= detail::kSignalEvery;
        unsignaled = signaled ? 0 : unsignaled + 1;
        wrs[i] =
            SendWr{.wr_id = make_wr_id(endpoint_->slot_, endpoint_->generation_, index_,
                                       with_done ? WrKind::kOp : WrKind::kOpQuiet,
                                       with_done ? entry_index : 0),
                   .opcode = Opcode::kWrite,
                   .flags = static_cast<uint8_t>(signaled ? kSignaled : 0),
                   .length = static_cast<uint32_t>(s.length),
                   .local_addr = s.src.addr,
                   .lkey = s.src.lkey,
                   .remote_addr = region.addr_at(s.offset),
                   .rkey = region.rkey};
      }
      const PostResult pr = qp_->post_send(std::span<const SendWr>(wrs.data(), n));
      posted = pr.posted;
      for (size_t i = 0; i < posted; ++i) {
        unsignaled_ = (wrs[i].flags & kSignaled) != 0 ? 0 : unsignaled_ + 1;
      }
      next += posted;
      if (posted == n && entry != nullptr) {
        ++next_pending_;
        entry->busy = true;
        entry->kind = static_cast<uint8_t>(WrKind::kOp);
        entry->opcode = Opcode::kWrite;
        entry->done = std::move(done);
        break;  // that was the last list
      }
      if (!pr.ok() && pr.status != PostStatus::kQueueFull) {
        return fail(Errc::kInvalid, what,
                    fmt::format("post failed after {} of {} WRITEs: {}", next,
                                segments.size(), post_status_name(pr.status)));
      }
      if (posted == n) continue;
      blocked = fail(Errc::kQueueFull, what, "send queue full");
    }
    // Queue full: make progress, then post the rest.
    if (posted > 0) spins = 0;
    if (spins == 0) {
      deadline = Clock::now() + endpoint_->engine_->options().op_timeout;
    } else if (Clock::now() >= deadline) {
      blocked.detail += fmt::format(" ({} of {} WRITEs posted)", next, segments.size());
      return blocked;
    }
    ++spins;
    lock.unlock();
    progress_or_pause(spins);
    lock.lock();
  }
  return {};
}

// Waits for one operation: on the progress thread (or without library
// threads) by running the progress loop, elsewhere on a condition variable.
OpResult Channel::sync(const std::function<OpResult(OpCallback)>& start) {
  if (app_progress_) return sync_progressing(start);
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    OpResult result;
  };
  auto waiter = std::make_shared<Waiter>();
  OpResult posted = start([waiter](const OpResult& r) {
    std::lock_guard lock(waiter->mu);
    waiter->result = r;
    waiter->done = true;
    waiter->cv.notify_all();
  });
  if (!posted.ok()) return posted;
  const auto timeout = endpoint_->engine_->options().op_timeout;
  const auto deadline = Clock::now() + timeout;
  detail::Worker* worker = endpoint_->worker_;
  const bool self_progress =
      app_progress_ || (worker != nullptr && worker->on_worker_thread());
  std::unique_lock lock(waiter->mu);
  while (!waiter->done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      return fail(
          Errc::kTimeout, "operation",
          "no completion within op_timeout (" + std::to_string(timeout.count()) + " ms)");
    }
    if (self_progress && worker != nullptr) {
      lock.unlock();
      worker->run_once(std::chrono::milliseconds(1));
      lock.lock();
    } else {
      waiter->cv.wait_until(lock, deadline);
    }
  }
  return waiter->result;
}

struct Channel::SyncFrame {
  uint64_t ticket = 0;
  bool done = false;
  OpResult result;
  SyncFrame* below = nullptr;
};

// Without library threads the callback runs on this thread (inside
// run_once), so the waiter is a frame on this stack: the callback captures
// the channel and the operation's number (two words, inside std::function's
// small buffer) and finds the frame while it waits; the callback of an
// operation whose caller timed out finds none and does nothing.
OpResult Channel::sync_progressing(const std::function<OpResult(OpCallback)>& start) {
  SyncFrame frame;
  frame.ticket = ++sync_issued_;
  frame.below = sync_top_;
  sync_top_ = &frame;
  struct Pop {
    Channel* ch;
    SyncFrame* frame;
    ~Pop() { ch->sync_top_ = frame->below; }
  } pop{this, &frame};
  OpResult posted = start([this, ticket = frame.ticket](const OpResult& r) {
    for (SyncFrame* f = sync_top_; f != nullptr; f = f->below) {
      if (f->ticket == ticket) {
        f->result = r;
        f->done = true;
        return;
      }
    }
  });
  if (!posted.ok()) return posted;
  detail::Worker* worker = endpoint_->worker_;
  const auto timeout = endpoint_->engine_->options().op_timeout;
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!frame.done) {
    if (Clock::now() >= deadline) {
      return fail(
          Errc::kTimeout, "operation",
          "no completion within op_timeout (" + std::to_string(timeout.count()) + " ms)");
    }
    if (worker == nullptr) return closed_result("operation");
    worker->run_once(std::chrono::milliseconds(1));
  }
  return std::move(frame.result);
}

OpResult Channel::write_sync(std::string_view remote, uint64_t offset, Local src,
                             size_t length) {
  return sync(
      [&](OpCallback cb) { return write(remote, offset, src, length, std::move(cb)); });
}
OpResult Channel::read_sync(std::string_view remote, uint64_t offset, Local dst,
                            size_t length) {
  return sync(
      [&](OpCallback cb) { return read(remote, offset, dst, length, std::move(cb)); });
}
OpResult Channel::write_with_imm_sync(std::string_view remote, uint64_t offset, Local src,
                                      size_t length, uint32_t imm) {
  return sync([&](OpCallback cb) {
    return write_with_imm(remote, offset, src, length, imm, std::move(cb));
  });
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

bool Channel::take_pending(uint32_t index, Pending* out) {
  std::lock_guard lock(mu_);
  if (index >= pending_.size() || !pending_[index].busy) return false;
  *out = std::move(pending_[index]);
  pending_[index] = Pending{};
  return true;
}

// Closes the channel to new work and completes every pending operation with
// the endpoint's disconnect reason (callbacks run outside the lock).
void Channel::fail_all_pending(const DisconnectInfo& info) {
  std::vector<Pending> failed;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (Pending& p : pending_) {
      if (p.busy) {
        failed.push_back(std::move(p));
        p = Pending{};
      }
    }
  }
  for (Pending& p : failed) {
    if (!p.done) continue;
    OpResult r;
    r.code = Errc::kClosed;
    r.status = Status::kWrFlushError;
    r.detail = std::string(opcode_name(p.opcode)) + " on channel '" + name_ + "' to " +
               endpoint_->peer() + " (" + endpoint_->provider_name() +
               "): endpoint closed (" + disconnect_reason_name(info.reason) +
               (info.detail.empty() ? "" : ": " + info.detail) + ")";
    p.done(r);
  }
  {
    std::lock_guard lock(inbox_mu_);
    inbox_closed_ = true;
    inbox_cv_.notify_all();
  }
}

// Destroys the QP (no more completions from it). Held messages stay valid
// until released; their release no longer re-posts.
void Channel::mark_closed() {
  std::lock_guard lock(mu_);
  closed_ = true;
  qp_.reset();
}

}  // namespace rdmakit::session
