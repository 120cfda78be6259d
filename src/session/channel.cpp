// The channel itself: construction and connection setup, the public
// accessors, the error results, posting (with the pending-operation table and
// retries while the send queue is full), the completion side of pending
// operations, and teardown.
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <thread>
#include <utility>

#include "channel_core.hpp"
#include "engine.hpp"
#include "wire.hpp"

namespace rdmakit::session {

using detail::ChannelCore;
using detail::core;
using detail::MsgHeader;
using Clock = std::chrono::steady_clock;

namespace {
uint32_t slot_size(uint32_t max_message) {
  const uint32_t raw = max_message + static_cast<uint32_t>(sizeof(MsgHeader));
  return (raw + 63u) & ~63u;
}
}  // namespace

// ---- construction and connection setup ----

ChannelCore::ChannelCore(Endpoint* endpoint, uint32_t index, std::string name)
    : endpoint_(endpoint), index_(index), name_(std::move(name)) {
  detail::Engine& engine = *endpoint->engine_;
  const SessionOptions& o = engine.options();
  slot_size_ = slot_size(o.max_message);
  depth_ = o.recv_depth;
  recv_mr_ = engine.ctx().allocate(size_t{depth_} * slot_size_, kAccessLocalWrite);
  handler_mode_ = static_cast<bool>(engine.handlers().on_message);
  app_progress_ = o.thread_mode == ThreadMode::kApplication;
  mu_.set_shared(!app_progress_);
  inbox_.resize(depth_);
  peer_reposted_ = reinterpret_cast<const uint64_t*>(
      endpoint->ctrl_mr_->data() + detail::kCtrlCredits + size_t{8} * index);
}

ChannelCore::~ChannelCore() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    qp_.reset();
  }
  inbox_.clear();
}

void ChannelCore::attach(std::unique_ptr<QueuePair> qp, uint32_t peer_depth,
                         uint32_t peer_max_message) {
  Context& ctx = endpoint_->engine_->ctx();
  qp_ = std::move(qp);
  peer_depth_ = peer_depth;
  peer_max_message_ = peer_max_message;
  send_mr_ = ctx.allocate(size_t{peer_depth} * (peer_max_message + sizeof(MsgHeader)),
                          kAccessLocalWrite);
  pending_.resize(qp_->options().max_send_wr);
}

bool ChannelCore::post_initial_recvs(std::string* why) {
  std::lock_guard lock(mu_);
  for (uint32_t i = 0; i < depth_; ++i) {
    const RecvWr wr{.wr_id = wr_id_for(WrKind::kRecv, i),
                    .addr = recv_mr_->data() + size_t{i} * slot_size_,
                    .length = slot_size_,
                    .lkey = recv_mr_->lkey()};
    const PostResult r = qp_->post_recv(wr);
    if (!r.ok()) {
      *why = "posting receive " + std::to_string(i) + " of " + std::to_string(depth_) +
             " on channel '" + name_ + "': " + post_status_name(r.status);
      return false;
    }
  }
  return true;
}

// ---- the public accessors ----

const std::string& Channel::name() const noexcept { return core(*this).name_; }
uint32_t Channel::index() const noexcept { return core(*this).index_; }
Endpoint& Channel::endpoint() const noexcept { return *core(*this).endpoint_; }
uint32_t Channel::max_message() const noexcept { return core(*this).peer_max_message_; }

// ---- errors and posting, shared by every operation ----

OpResult ChannelCore::fail(Errc code, const char* what, const std::string& why) const {
  OpResult r;
  r.code = code;
  r.status = Status::kGeneralError;
  r.detail = std::string(what) + " on channel '" + name_ + "' to " + endpoint_->peer() +
             " (" + endpoint_->provider_name() + "): " + why;
  return r;
}

OpResult ChannelCore::closed_result(const char* what) const {
  const DisconnectInfo info = endpoint_->disconnect_info();
  OpResult r =
      fail(Errc::kClosed, what,
           std::string("endpoint closed (") + disconnect_reason_name(info.reason) +
               (info.detail.empty() ? "" : ": " + info.detail) + ")");
  r.status = Status::kWrFlushError;
  return r;
}

// While waiting for a credit or a send-queue slot: on the progress thread
// (or in application mode) the wait runs the progress loop, since what we
// wait for may need our own completions polled or messages consumed (handlers
// may run nested); on other threads it yields, then sleeps briefly.
void ChannelCore::progress_or_pause(uint32_t spins) {
  detail::Worker* worker = endpoint_->worker_;
  if (worker != nullptr && (app_progress_ || worker->on_worker_thread())) {
    worker->run_once(std::chrono::milliseconds(0));
  } else if (spins < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

OpResult ChannelCore::post_retrying(std::unique_lock<detail::DatapathMutex>& lock,
                                    SendWr& wr, uint8_t kind, OpCallback& done,
                                    Buffer* buffer) {
  Clock::time_point deadline{};
  for (uint32_t spins = 0;; ++spins) {
    OpResult r = post_locked(wr, kind, done, buffer);
    if (r.code != Errc::kQueueFull) return r;
    if (spins == 0) {
      deadline = Clock::now() + op_timeout();
    } else if (Clock::now() >= deadline) {
      return r;
    }
    lock.unlock();
    progress_or_pause(spins);
    lock.lock();
    if (closed_) return closed_result(opcode_name(wr.opcode));
  }
}

OpResult ChannelCore::post_locked(SendWr& wr, uint8_t kind, OpCallback& done,
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
  wr.wr_id = wr_id_for(k, index);
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

// The endpoint's heartbeat (sent on channel 0): its counter, one inline
// WRITE into the peer's control block. A failure completes with an error
// status.
void ChannelCore::post_heartbeat() {
  std::lock_guard lock(mu_);
  if (closed_) return;
  const uint64_t value = ++endpoint_->heartbeat_sent_;
  const RemoteRegion& peer_ctrl = endpoint_->peer_ctrl_;
  SendWr wr{.wr_id = wr_id_for(WrKind::kInternal, 1),
            .opcode = Opcode::kWrite,
            .flags = kSignaled | kInline,
            .length = sizeof value,
            .local_addr = const_cast<uint64_t*>(&value),
            .remote_addr = peer_ctrl.addr_at(detail::kCtrlHeartbeat),
            .rkey = peer_ctrl.rkey};
  (void)qp_->post_send(wr);
}

// ---- completions of pending operations, and teardown ----

bool ChannelCore::take_pending(uint32_t index, Pending* out) {
  std::lock_guard lock(mu_);
  if (index >= pending_.size() || !pending_[index].busy) return false;
  *out = std::move(pending_[index]);
  pending_[index] = Pending{};
  return true;
}

// Closes the channel to new work and completes every pending operation with
// the endpoint's disconnect reason (callbacks run outside the lock).
void ChannelCore::fail_all_pending(const DisconnectInfo& info) {
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
void ChannelCore::mark_closed() {
  std::lock_guard lock(mu_);
  closed_ = true;
  qp_.reset();
}

void ChannelCore::release_memory() {
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

}  // namespace rdmakit::session
