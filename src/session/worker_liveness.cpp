// The Worker's side of an endpoint's life after adoption: heartbeats out,
// liveness and close requests in (tick), and its end: kill, the short linger
// for a goodbye on its way, reaping, and the shutdown of every endpoint.
#include <algorithm>
#include <thread>

#include "channel_core.hpp"
#include "engine.hpp"
#include "log.hpp"

namespace rdmakit::session::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
// A goodbye gets at most this long to leave before the QP that carries it is
// destroyed; its completion ends the wait sooner.
constexpr milliseconds kLinger{100};
}  // namespace

// Heartbeats out, liveness and close requests in, for every endpoint.
void Worker::tick(Clock::time_point now) {
  const SessionOptions& o = engine_.options();
  const bool heartbeat_due = now >= next_tick_;
  if (heartbeat_due) next_tick_ = now + o.heartbeat;
  close_pending_.store(false);
  for (uint32_t slot = 0; slot < capacity_; ++slot) {
    Endpoint* ep = slot_ptr_[slot].load(std::memory_order_acquire);
    if (ep == nullptr || ep->closed()) continue;
    if (ep->close_requested_.load()) {
      kill(*ep, {DisconnectReason::kLocalClose, "closed by this side"});
      continue;
    }
    if (!heartbeat_due || !ep->connected()) continue;
    const uint64_t seen = load_peer_written(
        reinterpret_cast<const uint64_t*>(ep->ctrl_mr_->data() + kCtrlHeartbeat));
    if (seen != ep->heartbeat_seen_) {
      ep->heartbeat_seen_ = seen;
      ep->heartbeat_changed_ = now;
    } else if (now - ep->heartbeat_changed_ > o.liveness) {
      const auto silent =
          std::chrono::duration_cast<milliseconds>(now - ep->heartbeat_changed_).count();
      kill(*ep, {DisconnectReason::kPeerSilent,
                 "no heartbeat from " + ep->peer() + " (" + ep->provider_name() +
                     ") for " + std::to_string(silent) + " ms (liveness bound " +
                     std::to_string(o.liveness.count()) + " ms)"});
      continue;
    }
    ep->channels_[0]->post_heartbeat();
  }
}

// Takes the endpoint down: goodbye (local close), pending operations fail,
// pull receivers wake, on_disconnect runs; the QPs go after a short linger.
void Worker::kill(Endpoint& ep, DisconnectInfo info) {
  const Endpoint::State before = ep.state_.load();
  if (before == Endpoint::State::kClosed) return;
  uint64_t goodbye = 0;
  if (info.reason == DisconnectReason::kLocalClose &&
      !ep.channels_[0]->send_control(MsgKind::kGoodbye, {}, &goodbye)) {
    goodbye = 0;
  }
  // A close by either side is the normal end of an endpoint (a client
  // leaving, a mesh rank finishing): debug. A failure or a silent peer: warn.
  const bool normal = info.reason == DisconnectReason::kLocalClose ||
                      info.reason == DisconnectReason::kPeerClosed;
  log().log(normal ? spdlog::level::debug : spdlog::level::warn,
            "session: endpoint {:x} to {} ({}) disconnected: {}{}{}", ep.id(), ep.peer(),
            ep.provider_name(), disconnect_reason_name(info.reason),
            info.detail.empty() ? "" : ": ", info.detail);
  {
    std::lock_guard lock(ep.info_mu_);
    ep.info_ = info;
  }
  ep.state_.store(Endpoint::State::kClosed);
  for (auto& ch : ep.channels_) ch->fail_all_pending(info);
  if (before == Endpoint::State::kReady && engine_.handlers().on_disconnect) {
    engine_.handlers().on_disconnect(ep, info);
  }
  if (live_.load() > 0) --live_;
  std::shared_ptr<Endpoint> owner;
  {
    std::lock_guard lock(slots_mu_);
    owner = owners_[ep.slot_];
  }
  // Only a goodbye on its way is worth lingering for; its completion (or
  // kLinger) ends the linger.
  const auto linger = goodbye != 0 ? kLinger : milliseconds(0);
  graves_.push_back({std::move(owner), Clock::now() + linger, goodbye});
  // The next pass reaps (and a per-endpoint worker retires) without first
  // sleeping for a heartbeat period.
  if (goodbye == 0) close_pending_.store(true, std::memory_order_relaxed);
}

void Worker::goodbye_left(uint64_t wr_id) noexcept {
  for (Grave& g : graves_) {
    if (g.goodbye == wr_id) {
      g.goodbye = 0;
      close_pending_.store(true, std::memory_order_relaxed);
    }
  }
}

bool Worker::lingering(Clock::time_point now) const noexcept {
  return std::any_of(graves_.begin(), graves_.end(),
                     [now](const Grave& g) { return g.goodbye != 0 && now < g.until; });
}

void Worker::reap(Clock::time_point now, bool all) {
  for (size_t i = 0; i < graves_.size();) {
    if (!all && graves_[i].goodbye != 0 && now < graves_[i].until) {
      ++i;
      continue;
    }
    std::shared_ptr<Endpoint> ep = std::move(graves_[i].endpoint);
    graves_.erase(graves_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!ep) continue;
    for (auto& ch : ep->channels_) {
      ch->mark_closed();
      // At shutdown the memory goes too: it must not outlive the context.
      if (all) ch->release_memory();
    }
    if (all) {
      ep->ctrl_mr_.reset();
      ep->own_buffers_.clear();
    }
    std::lock_guard lock(slots_mu_);
    slot_ptr_[ep->slot_].store(nullptr, std::memory_order_release);
    owners_[ep->slot_].reset();
    free_slots_.push_back(ep->slot_);
  }
}

void Worker::shutdown() {
  if (inbox_pending_.load()) adopt_pending();
  for (uint32_t slot = 0; slot < capacity_; ++slot) {
    Endpoint* ep = slot_ptr_[slot].load();
    if (ep != nullptr && !ep->closed()) {
      kill(*ep, {DisconnectReason::kLocalClose, "the session was destroyed"});
    }
  }
  flush_wait_.clear();  // closed above
  // Let the goodbyes leave: their completions say they did. Nothing to
  // wait for when every endpoint was closed (and its goodbye gone) already.
  while (lingering(Clock::now())) {
    const int n = cq_->poll(batch_);
    dispatch_all(batch_, n);
    if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  reap(Clock::now(), true);
  std::lock_guard lock(slots_mu_);
  for (auto& owner : owners_) owner.reset();
}

}  // namespace rdmakit::session::detail
