// The verbs listener. Every connection id a request creates stays on the
// listener's event channel until its handshake completes, so one channel
// drives all the handshakes in flight: accept() reads whatever events have
// arrived, moves each handshake on (answer, ESTABLISHED, READ of the rest of
// the private data), and returns the first one complete. A peer that stalls
// its handshake holds one entry until kHandshakeTimeout, not the listener.
#include "providers/verbs/verbs_listener.hpp"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/address.hpp"
#include "core/little_endian.hpp"
#include "core/log.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::verbs {

using core::Clock;

namespace {

const char* stage_name(PendingHandshake::Stage stage) {
  switch (stage) {
    case PendingHandshake::Stage::kRequested: return "request not answered";
    case PendingHandshake::Stage::kAnswered: return "answered, waiting for the RTU";
    case PendingHandshake::Stage::kReading: return "reading the private data";
    case PendingHandshake::Stage::kDone: return "complete";
  }
  return "?";
}

// Another accept() call may return this connection only if it would have
// created the same QP and sent the same reply.
bool same_answer(const PendingHandshake& p, const QpOptions& o,
                 std::span<const std::byte> reply) {
  const QpOptions& a = p.options;
  return a.send_cq == o.send_cq && a.recv_cq == o.recv_cq && a.srq == o.srq &&
         a.max_send_wr == o.max_send_wr && a.max_recv_wr == o.max_recv_wr &&
         a.max_inline == o.max_inline && a.rnr_timeout == o.rnr_timeout &&
         a.peer_timeout == o.peer_timeout && a.thread_safe == o.thread_safe &&
         a.caller_serializes == o.caller_serializes &&
         std::equal(p.reply.begin(), p.reply.end(), reply.begin(), reply.end());
}

}  // namespace

std::unique_ptr<QueuePair> VerbsListener::accept(const QpOptions& options,
                                                 std::chrono::milliseconds timeout,
                                                 std::span<const std::byte> reply) {
  const auto deadline = Clock::now() + timeout;
  const std::string self = address();
  if (reply.size() > Context::kMaxPrivateData) {
    throw Error("accept", kProvider, self, EINVAL,
                fmt::format("reply private data is {} bytes; at most {}", reply.size(),
                            Context::kMaxPrivateData));
  }
  // Held while the handshakes are looked at, not while waiting for events.
  // A failure another thread's call recorded is reported by whichever call
  // comes to it first without a connection to return.
  std::unique_lock lock(mu_);
  for (;;) {
    take_events();
    poll_reads();
    expire();
    if (auto qp = take_done(options, reply)) return qp;
    answer_requests(options, reply);
    if (auto qp = take_done(options, reply)) return qp;
    if (failure_) {
      Error failure = std::move(*failure_);
      failure_.reset();
      throw failure;
    }
    const int left = core::ms_left(deadline);
    if (left == 0) {
      size_t answered = 0;
      for (const Pending& p : pending_) {
        if (p->stage != PendingHandshake::Stage::kRequested) ++answered;
      }
      throw Error("accept", kProvider, self, ETIMEDOUT,
                  pending_.empty()
                      ? std::string("no connection request before the deadline")
                      : fmt::format("no handshake completed before the deadline ({} in "
                                    "flight, {} answered; they stay pending)",
                                    pending_.size(), answered));
    }
    int wait = std::min(left, next_timer_ms());
    // The READ's completion comes on a CQ, not on the channel: look often.
    for (const Pending& p : pending_) {
      if (p->stage == PendingHandshake::Stage::kReading) wait = std::min(wait, 1);
    }
    pollfd pfd{channel_->fd, POLLIN, 0};
    lock.unlock();
    ::poll(&pfd, 1, wait);  // EINTR or a spurious wake-up: looked at again
    lock.lock();
  }
}

void VerbsListener::take_events() {
  const std::string self = address();
  while (auto event = queued_event(channel_.get(), "accept", self)) {
    if (event->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
      on_request(*event);
      continue;
    }
    const size_t i = find(event->id);
    if (i == pending_.size()) {
      core::log().debug("verbs: listener {} ignores {} (status {})", self,
                        rdma_event_str(event->type), event->status);
      continue;
    }
    PendingHandshake& p = *pending_[i];
    if (event->type == RDMA_CM_EVENT_ESTABLISHED &&
        p.stage == PendingHandshake::Stage::kAnswered) {
      on_established(p);
      // Complete: returned before any later event of its id is read. Its
      // adoption moves those (a DISCONNECTED right behind, from a peer that
      // connects and leaves at once) to the progress thread's channel with
      // the id, which handles them as for any connection.
      if (p.stage == PendingHandshake::Stage::kDone) return;
      continue;
    }
    // REJECTED, CONNECT_ERROR, UNREACHABLE, DISCONNECTED, DEVICE_REMOVAL: the
    // peer or its CM gave up before the handshake completed.
    fail(i, ECONNABORTED,
         fmt::format("the handshake failed: {} (status {})", rdma_event_str(event->type),
                     event->status));
  }
}

void VerbsListener::on_request(CmEvent& event) {
  auto p = std::make_unique<PendingHandshake>();
  p->id.reset(event.id);
  p->peer = core::sockaddr_string(rdma_get_peer_addr(p->id.get()));
  p->arrived = Clock::now();
  p->initiator_depth = event.initiator_depth;
  p->responder_resources = event.responder_resources;
  auto refuse = [&](int err, const std::string& why) {
    rdma_reject(p->id.get(), nullptr, 0);
    core::log().warn("verbs: listener {} refused a request from {}: {}", address(),
                     p->peer, why);
    if (!failure_) failure_.emplace("accept", kProvider, p->peer, err, why);
  };
  auto hello = parse_handshake(event.private_data);
  if (!hello) {
    refuse(EPROTO, "the connection request carries no rdmakit handshake");
    return;
  }
  // Private data beyond the REQ: its first bytes, then where to READ the rest.
  if (hello->total > kReqUserData) {
    if (hello->user.size() < kReqUserData) {
      refuse(EPROTO, "the connection request's private data overflow is incomplete");
      return;
    }
    const std::byte* desc = hello->user.data() + kReqOverflowUserData;
    p->overflow = true;
    p->overflow_addr = core::get_le<uint64_t>(desc);
    p->overflow_rkey = core::get_le<uint32_t>(desc + 8);
    hello->user.resize(kReqOverflowUserData);
  }
  if (p->id->verbs != device_->context) {
    refuse(ENODEV,
           fmt::format("request arrived on {}, this context uses {}",
                       ibv_get_device_name(p->id->verbs->device), device_->name()));
    return;
  }
  p->hello = std::move(*hello);
  if (pending_.full()) {
    core::log().warn("verbs: listener {}: {} handshakes pending, dropping the oldest",
                     address(), pending_.size());
    fail(0, ECONNABORTED, "dropped: too many handshakes pending on this listener");
  }
  pending_.emplace(std::move(p));
}

void VerbsListener::answer_requests(const QpOptions& options,
                                    std::span<const std::byte> reply) {
  const auto now = Clock::now();
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingHandshake& p = *pending_[i];
    if (p.stage != PendingHandshake::Stage::kRequested) continue;
    // Held while a handshake answered the same way is in flight, unless
    // that one looks stalled.
    const bool held =
        std::any_of(pending_.begin(), pending_.end(), [&](const Pending& q) {
          return q->stage != PendingHandshake::Stage::kRequested &&
                 q->stage != PendingHandshake::Stage::kDone &&
                 same_answer(*q, options, reply) && now - q->answered < kAnswerHold;
        });
    if (held) continue;
    try {
      answer(p, options, reply);
    } catch (const Error& e) {
      rdma_reject(p.id.get(), nullptr, 0);
      fail(i, e.sys_errno(), e.what());
      --i;
    }
  }
}

// Creates the QP, moves it to RTS and sends our REP.
void VerbsListener::answer(PendingHandshake& p, const QpOptions& options,
                           std::span<const std::byte> reply) {
  p.options = options;
  p.reply.assign(reply.begin(), reply.end());
  p.parts = create_qp(*device_, options, p.peer);
  to_init(p.id.get(), p.parts.qp.get(), p.peer);
  if (p.overflow) {
    // The rest of the client's private data is READ once connected.
    p.parts.handshake_buf.resize(p.hello.total - kReqOverflowUserData);
    register_handshake(*device_, p.parts, IBV_ACCESS_LOCAL_WRITE, p.peer);
  }
  const ibv_mtu mtu = std::min(device_->port_attr.active_mtu, p.hello.mtu);
  p.negotiated =
      bring_up(*device_, p.id.get(), p.parts.qp.get(), mtu, p.parts.options, p.peer);
  const std::vector<std::byte> answer = make_handshake(mtu, reply, reply.size());
  rdma_conn_param param = conn_param(*device_, answer, p.parts.qp->qp_num);
  // Never grant more reads in flight than the initiator asked for, and never
  // ask for more than the initiator can serve.
  param.responder_resources = std::min(param.responder_resources, p.initiator_depth);
  param.initiator_depth = std::min(param.initiator_depth, p.responder_resources);
  if (rdma_accept(p.id.get(), &param) != 0) {
    throw Error("accept", kProvider, p.peer, errno, "rdma_accept");
  }
  p.stage = PendingHandshake::Stage::kAnswered;
  p.answered = Clock::now();
}

void VerbsListener::on_established(PendingHandshake& p) {
  if (!p.overflow) {
    p.stage = PendingHandshake::Stage::kDone;
    p.done_order = next_done_order_++;
    return;
  }
  ibv_sge sge{reinterpret_cast<uint64_t>(p.parts.handshake_buf.data()),
              static_cast<uint32_t>(p.parts.handshake_buf.size()),
              p.parts.handshake_mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 0;  // sequence 0: the extra send slot the QP was created with
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = p.overflow_addr;
  wr.wr.rdma.rkey = p.overflow_rkey;
  p.parts.core->send_ring[0] = {UINT64_MAX, Opcode::kRead};
  p.parts.core->handshake_status.store(QpCore::kHandshakePending,
                                       std::memory_order_release);
  p.parts.core->send_published.store(1, std::memory_order_release);
  p.parts.core->send_posted = 1;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(p.parts.qp.get(), &wr, &bad); rc != 0) {
    fail(find(p.id.get()), rc,
         fmt::format("ibv_post_send of the READ of the private data overflow: {}",
                     std::strerror(rc)));
    return;
  }
  p.stage = PendingHandshake::Stage::kReading;
}

void VerbsListener::poll_reads() {
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingHandshake& p = *pending_[i];
    if (p.stage != PendingHandshake::Stage::kReading) continue;
    const auto wc = p.parts.send_cq->poll_handshake(p.parts.core.get());
    if (!wc) continue;
    if (wc->status != IBV_WC_SUCCESS) {
      fail(i, EPROTO,
           fmt::format("READ of the rest of the connect private data ({} bytes) "
                       "failed: {}",
                       p.parts.handshake_buf.size(),
                       status_name(map_wc_status(wc->status))));
      --i;
      continue;
    }
    p.hello.user.insert(p.hello.user.end(), p.parts.handshake_buf.begin(),
                        p.parts.handshake_buf.end());
    p.stage = PendingHandshake::Stage::kDone;
    p.done_order = next_done_order_++;
  }
}

void VerbsListener::expire() {
  const auto now = Clock::now();
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingHandshake& p = *pending_[i];
    if (now - p.arrived < kHandshakeTimeout) continue;
    // Not ETIMEDOUT: a caller polling accept() reads that as "no request
    // yet", and this request was real.
    const char* missing =
        p.stage == PendingHandshake::Stage::kAnswered
            ? "accepted, but no RDMA_CM_EVENT_ESTABLISHED (the peer's RTU)"
        : p.stage == PendingHandshake::Stage::kReading
            ? "established, but the READ of the rest of the connect private data did "
              "not complete"
        : p.stage == PendingHandshake::Stage::kDone
            ? "complete, but no accept() call passed the QP options and reply private "
              "data it was answered with"
            : "the request was not answered";
    fail(i, ECONNABORTED,
         fmt::format("{} within {} ms", missing, kHandshakeTimeout.count()));
    --i;
  }
}

std::unique_ptr<QueuePair> VerbsListener::take_done(const QpOptions& options,
                                                    std::span<const std::byte> reply) {
  size_t best = pending_.size();
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingHandshake& p = *pending_[i];
    if (p.stage != PendingHandshake::Stage::kDone) continue;
    // Its peer holds a reply (a stream's ring, a worker's port) and its QP
    // sits on CQs that this caller may not offer: returning it would hand
    // the caller a connection it did not answer. It waits for a call that
    // passes the same (a session server's workers take turns), until its
    // kHandshakeTimeout.
    if (!same_answer(p, options, reply)) continue;
    if (best == pending_.size() || p.done_order < pending_[best]->done_order) best = i;
  }
  if (best == pending_.size()) return nullptr;
  Pending done = pending_.take(best);
  log_connected(*device_, "accepted", done->peer, done->parts, done->negotiated,
                done->hello.mtu);
  auto conn = std::make_shared<ConnState>();
  ibv_qp* qp = done->parts.qp.get();
  rdma_cm_id* raw_id = done->id.get();
  auto result =
      std::make_unique<VerbsQp>(device_, std::move(done->id), std::move(done->parts),
                                done->peer, std::move(done->hello.user), conn);
  device_->progress().adopt(raw_id, qp, conn, done->peer);
  // A failure seen in the same call was logged; the connection matters more.
  failure_.reset();
  return result;
}

void VerbsListener::fail(size_t i, int err, const std::string& why) {
  if (i >= pending_.size()) return;
  const PendingHandshake& p = *pending_[i];
  core::log().warn("verbs: listener {} dropped the handshake with {} ({}): {}", address(),
                   p.peer, stage_name(p.stage), why);
  if (!failure_) failure_.emplace("accept", kProvider, p.peer, err, why);
  // Destroying the id rejects the request or, once answered, tells the peer.
  pending_.erase(i);
}

size_t VerbsListener::find(const rdma_cm_id* id) const {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i]->id.get() == id) return i;
  }
  return pending_.size();
}

int VerbsListener::next_timer_ms() const {
  const bool waiting = std::any_of(
      pending_.begin(), pending_.end(),
      [](const Pending& p) { return p->stage == PendingHandshake::Stage::kRequested; });
  int wait = 1 << 30;
  for (const Pending& p : pending_) {
    wait = std::min(wait, core::ms_left(p->arrived + kHandshakeTimeout) + 1);
    // The end of an answer hold matters only to a request held by it.
    if (waiting && p->stage == PendingHandshake::Stage::kAnswered &&
        Clock::now() - p->answered < kAnswerHold) {
      wait = std::min(wait, core::ms_left(p->answered + kAnswerHold) + 1);
    }
  }
  return wait;
}

}  // namespace rdmakit::verbs
