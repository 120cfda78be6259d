// The Worker's completion dispatch: each completion routed by its wr_id to
// its endpoint and channel (RECVs, pending operations, errors), flushes held
// until their cause is known, and the control messages (buffer table,
// goodbye) that arrive on channel 0.
#include <algorithm>
#include <optional>

#include "channel_core.hpp"
#include "engine.hpp"

namespace rdmakit::session::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
// How long a cause-less flush waits for the peer's goodbye (Worker::flush_wait_).
constexpr milliseconds kFlushGrace{20};
}  // namespace

void Worker::dispatch_all(std::span<Completion> batch, int n) {
  for (int i = 0; i < n; ++i) dispatch(batch[static_cast<size_t>(i)]);
  if (flushed_.empty()) return;
  // One more look for the completion that names the cause of the flushes.
  const int more = cq_->poll(batch);
  for (int i = 0; i < more; ++i) dispatch(batch[static_cast<size_t>(i)]);
  std::vector<FlushSeen> seen;
  seen.swap(flushed_);
  for (FlushSeen& f : seen) {
    if (f.endpoint->closed()) continue;
    if (std::any_of(flush_wait_.begin(), flush_wait_.end(),
                    [&](const FlushWait& w) { return w.endpoint.get() == f.endpoint; })) {
      continue;
    }
    std::shared_ptr<Endpoint> owner;
    {
      std::lock_guard lock(slots_mu_);
      owner = owners_[f.endpoint->slot_];
    }
    if (!owner) {
      kill(*f.endpoint, {DisconnectReason::kTransportError, std::move(f.detail)});
      continue;
    }
    flush_wait_.push_back(
        {std::move(owner), std::move(f.detail), Clock::now() + kFlushGrace});
  }
}

void Worker::settle_flushes(Clock::time_point now) {
  std::vector<FlushWait> waiting;
  waiting.swap(flush_wait_);
  for (FlushWait& w : waiting) {
    if (w.endpoint->closed()) continue;  // the goodbye came (or a better cause)
    if (now < w.until) {
      flush_wait_.push_back(std::move(w));
      continue;
    }
    kill(*w.endpoint, {DisconnectReason::kTransportError, std::move(w.detail)});
  }
}

void Worker::dispatch(const Completion& c) {
  const uint32_t slot = wr_slot(c.wr_id);
  if (slot >= capacity_) return;
  Endpoint* ep = slot_ptr_[slot].load(std::memory_order_acquire);
  // A completion of a QP already destroyed (or of an endpoint whose slot
  // was reused) is dropped.
  if (ep == nullptr ||
      slot_gen_[slot].load(std::memory_order_relaxed) != wr_gen(c.wr_id)) {
    return;
  }
  const uint32_t index = wr_channel(c.wr_id);
  if (index >= ep->channels_.size()) return;
  ChannelCore& ch = *ep->channels_[index];
  const WrKind kind = wr_kind(c.wr_id);
  const bool closed = ep->closed();
  auto error_text = [&](const char* op) {
    std::string s = std::string(op) + " on channel '" + ch.name() + "' to " + ep->peer() +
                    " (" + ep->provider_name() + "): " + status_name(c.status);
    if (c.vendor_err != 0) s += " (vendor error " + std::to_string(c.vendor_err) + ")";
    return s;
  };
  switch (kind) {
    case WrKind::kRecv:
      if (closed) return;
      if (c.ok()) {
        ch.on_recv(c);
      } else {
        fail_endpoint_after(c, *ep, error_text("RECV"));
      }
      return;
    case WrKind::kOpQuiet:
      // Selectively signaled: only a failure comes here.
      if (!c.ok() && !closed) {
        fail_endpoint_after(c, *ep, error_text(opcode_name(c.opcode)));
      }
      return;
    case WrKind::kSendCopy:
      if (closed) goodbye_left(c.wr_id);
      [[fallthrough]];
    case WrKind::kInternal:
      if (!c.ok() && !closed) {
        fail_endpoint_after(
            c, *ep,
            error_text(kind == WrKind::kInternal ? "WRITE (credits/heartbeat)" : "SEND"));
      }
      return;
    case WrKind::kSendZeroCopy:
    case WrKind::kOp: {
      ChannelCore::Pending p;
      if (!ch.take_pending(wr_index(c.wr_id), &p)) return;
      OpResult r;
      if (!c.ok()) {
        r.code = Errc::kTransport;
        r.status = c.status;
        r.detail = error_text(opcode_name(p.opcode));
      }
      if (p.done) p.done(r);
      if (!c.ok() && !closed) {
        fail_endpoint_after(c, *ep, r.detail);
      }
      return;
    }
  }
}

void Worker::fail_endpoint(Endpoint& ep, DisconnectReason reason, std::string detail) {
  kill(ep, {reason, std::move(detail)});
}

void Worker::fail_endpoint_after(const Completion& c, Endpoint& ep, std::string detail) {
  // A flush, or a peer found gone (its QP destroyed after it said goodbye,
  // which may still wait in our receive queue): the goodbye gets its grace.
  if (c.status != Status::kWrFlushError && c.status != Status::kRetryExceeded) {
    kill(ep, {DisconnectReason::kTransportError, std::move(detail)});
    return;
  }
  for (const FlushSeen& f : flushed_) {
    if (f.endpoint == &ep) return;
  }
  flushed_.push_back({&ep, std::move(detail)});
}

void Worker::on_control(Endpoint& ep, MsgKind kind, std::span<const std::byte> payload) {
  if (kind == MsgKind::kGoodbye) {
    kill(ep, {DisconnectReason::kPeerClosed,
              "the peer " + ep.peer() + " closed the endpoint"});
    return;
  }
  if (kind != MsgKind::kTable || ep.state_.load() != Endpoint::State::kConnecting) {
    kill(ep, {DisconnectReason::kTransportError,
              "unexpected control message " + std::to_string(static_cast<int>(kind)) +
                  " from " + ep.peer()});
    return;
  }
  std::string why;
  std::optional<Table> table = decode_table(payload, &why);
  if (!table) {
    kill(ep, {DisconnectReason::kTransportError,
              "buffer table from " + ep.peer() + ": " + why});
    return;
  }
  ep.peer_ctrl_ = table->ctrl;
  // The client names the channels; the server learns the names here.
  if (engine_.is_server() && table->channel_names.size() == ep.channels_.size()) {
    for (size_t i = 0; i < ep.channels_.size(); ++i) {
      ep.channels_[i]->rename(table->channel_names[i]);
    }
  }
  ep.remote_buffers_ = std::move(table->buffers);
  ep.heartbeat_changed_ = Clock::now();
  ep.state_.store(Endpoint::State::kReady);
  if (engine_.handlers().on_connect) engine_.handlers().on_connect(ep);
}

}  // namespace rdmakit::session::detail
