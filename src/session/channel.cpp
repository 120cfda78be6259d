// What every operation of a channel shares: construction and teardown, the
// error results, posting (with the pending-operation table and retries while
// the send queue is full) and the completion side of pending operations.
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <thread>
#include <utility>

#include "engine.hpp"
#include "wire.hpp"

namespace rdmakit::session {

using detail::make_wr_id;
using detail::WrKind;
using Clock = std::chrono::steady_clock;

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

bool Channel::signal_due() noexcept { return unsignaled_ + 1 >= detail::kSignalEvery; }

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
