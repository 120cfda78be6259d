#include "fake_fabric.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace rdmakit::fake {

Fabric& Fabric::get() {
  static Fabric* f = new Fabric();  // never destroyed: objects may outlive a test
  return *f;
}

void Fabric::deliver(CqCore& cq, const CqCore::Entry& e) {
  if (!cq.alive) return;
  cq.ring.push_back(e);
  if (cq.armed) {
    cq.armed = false;
    const uint64_t one = 1;
    (void)::write(cq.efd, &one, sizeof one);
  }
}

void Fabric::push(const std::shared_ptr<CqCore>& cq, const Completion& c,
                  uint32_t retire) {
  auto it = qps.find(c.qp_num);
  const bool frozen = it != qps.end() && it->second->frozen;
  const Verdict v = frozen ? Verdict::kHold : filter ? filter(c) : Verdict::kDeliver;
  if (v == Verdict::kDrop) return;  // a lost completion: its send slots stay taken
  if (v == Verdict::kHold) {
    held.push_back(Held{cq, CqCore::Entry{c, retire}});
    return;
  }
  deliver(*cq, CqCore::Entry{c, retire});
}

void Fabric::complete_send(QpCore& qp, const PendingSend& p, Status st) {
  if (st == Status::kSuccess && (p.wr.flags & kSignaled) == 0) {
    ++qp.unsignaled;
    return;
  }
  Completion c;
  c.wr_id = p.wr.wr_id;
  c.byte_len = p.wr.length;
  c.qp_num = qp.num;
  c.opcode = p.wr.opcode;
  c.status = st;
  push(qp.send_cq, c, qp.unsignaled + 1);
  qp.unsignaled = 0;
}

bool Fabric::take_recv(QpCore& target, RecvWr* out) {
  auto& q = target.srq ? target.srq->rq : target.rq;
  if (q.empty()) return false;
  *out = q.front();
  q.pop_front();
  return true;
}

bool Fabric::local_ok(uint32_t ctx, const SendWr& wr) const {
  if (wr.length == 0) return true;
  const auto addr = reinterpret_cast<uintptr_t>(wr.local_addr);
  auto it = regions.find(wr.lkey);
  return it != regions.end() && it->second.ctx == ctx && addr >= it->second.addr &&
         addr + wr.length <= it->second.addr + it->second.length;
}

const Region* Fabric::remote_region(uint32_t ctx, uint32_t rkey, uint64_t addr,
                                    uint64_t len, uint32_t need) const {
  auto it = regions.find(rkey);
  if (it == regions.end()) return nullptr;
  const Region& r = it->second;
  if (r.ctx != ctx || (r.access & need) != need || addr < r.addr ||
      addr + len > r.addr + r.length)
    return nullptr;
  return &r;
}

Fabric::Step Fabric::execute(QpCore& qp, PendingSend& p) {
  if (qp.dead) return Step::kDone;  // its process is gone: nothing happens
  if (qp.frozen) return Step::kWait;
  if (qp.state != QpState::kConnected) {
    complete_send(qp, p, Status::kWrFlushError);
    return Step::kDone;
  }
  auto peer = qp.peer.lock();
  if (!peer || peer->dead) return Step::kWait;  // the ticker fails it at peer_timeout
  const SendWr& wr = p.wr;
  const void* src = p.inline_copy.empty() ? wr.local_addr : p.inline_copy.data();
  auto fail = [&](Status st) {
    complete_send(qp, p, st);
    to_error(qp);
    return Step::kDone;
  };
  const bool sources = wr.opcode == Opcode::kSend || wr.opcode == Opcode::kSendWithImm ||
                       wr.opcode == Opcode::kWrite || wr.opcode == Opcode::kWriteWithImm;
  if (!((wr.flags & kInline) != 0 && sources) && !local_ok(qp.ctx, wr))
    return fail(Status::kLocalProtectionError);
  switch (wr.opcode) {
    case Opcode::kSend:
    case Opcode::kSendWithImm:
    case Opcode::kWriteWithImm: {
      const Region* region = nullptr;
      if (wr.opcode == Opcode::kWriteWithImm) {
        region = remote_region(peer->ctx, wr.rkey, wr.remote_addr, wr.length,
                               kAccessRemoteWrite);
        if (region == nullptr) return fail(Status::kRemoteAccessError);
      }
      RecvWr r;
      // A refused message stays refused: its sender's RNR retries run out.
      if (!p.refused && peer->refuse > 0) {
        --peer->refuse;
        p.refused = true;
      }
      if (p.refused || !take_recv(*peer, &r)) {
        if (p.deadline == Clock::time_point{}) p.deadline = Clock::now() + qp.rnr_timeout;
        return Step::kWait;  // retried when the peer posts a RECV
      }
      Completion rc;
      rc.wr_id = r.wr_id;
      rc.qp_num = peer->num;
      rc.imm = wr.imm;
      if (wr.opcode == Opcode::kWriteWithImm) {
        if (wr.length > 0)
          std::memcpy(reinterpret_cast<void*>(wr.remote_addr), src, wr.length);
        rc.opcode = Opcode::kRecvWriteWithImm;
        rc.byte_len = wr.length;
        rc.flags = kCompletionHasImm;
      } else {
        if (wr.length > r.length) {
          rc.opcode = Opcode::kRecv;
          rc.status = Status::kLocalLengthError;
          push(peer->recv_cq, rc, 0);
          to_error(*peer);
          return fail(Status::kRemoteInvalidRequestError);
        }
        if (wr.length > 0) std::memcpy(r.addr, src, wr.length);
        rc.opcode = Opcode::kRecv;
        rc.byte_len = wr.length;
        rc.flags = wr.opcode == Opcode::kSendWithImm ? kCompletionHasImm : 0;
      }
      push(peer->recv_cq, rc, 0);
      break;
    }
    case Opcode::kWrite: {
      if (remote_region(peer->ctx, wr.rkey, wr.remote_addr, wr.length,
                        kAccessRemoteWrite) == nullptr)
        return fail(Status::kRemoteAccessError);
      if (wr.length > 0)
        std::memcpy(reinterpret_cast<void*>(wr.remote_addr), src, wr.length);
      break;
    }
    case Opcode::kRead: {
      if (remote_region(peer->ctx, wr.rkey, wr.remote_addr, wr.length,
                        kAccessRemoteRead) == nullptr)
        return fail(Status::kRemoteAccessError);
      if (wr.length > 0)
        std::memcpy(wr.local_addr, reinterpret_cast<const void*>(wr.remote_addr),
                    wr.length);
      break;
    }
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd: {
      if (remote_region(peer->ctx, wr.rkey, wr.remote_addr, 8, kAccessRemoteAtomic) ==
          nullptr)
        return fail(Status::kRemoteAccessError);
      std::atomic_ref<uint64_t> target(*reinterpret_cast<uint64_t*>(wr.remote_addr));
      uint64_t old = wr.compare_add;
      if (wr.opcode == Opcode::kCompareSwap) {
        target.compare_exchange_strong(old, wr.swap);
      } else {
        old = target.fetch_add(wr.compare_add);
      }
      std::memcpy(wr.local_addr, &old, sizeof old);
      break;
    }
    default: return fail(Status::kLocalQpOperationError);
  }
  complete_send(qp, p, Status::kSuccess);
  if (++qp.executed >= qp.kill_at) kill_locked(qp);
  return Step::kDone;
}

void Fabric::progress(QpCore& qp) {
  while (!qp.sq.empty()) {
    PendingSend p = std::move(qp.sq.front());
    qp.sq.pop_front();
    if (execute(qp, p) == Step::kWait) {
      qp.sq.push_front(std::move(p));
      break;
    }
  }
}

void Fabric::to_error(QpCore& qp) {
  if (qp.state == QpState::kError || qp.dead) return;
  qp.state = QpState::kError;
  while (!qp.sq.empty()) {
    PendingSend p = std::move(qp.sq.front());
    qp.sq.pop_front();
    p.wr.flags |= kSignaled;  // errors always complete
    complete_send(qp, p, Status::kWrFlushError);
  }
  for (const RecvWr& r : qp.rq) {
    Completion c;
    c.wr_id = r.wr_id;
    c.qp_num = qp.num;
    c.opcode = Opcode::kRecv;
    c.status = Status::kWrFlushError;
    push(qp.recv_cq, c, 0);
  }
  qp.rq.clear();
}

void Fabric::kill_locked(QpCore& qp) {
  qp.dead = true;
  if (auto peer = qp.peer.lock(); peer && !peer->peer_gone_set) {
    peer->peer_gone_set = true;
    peer->peer_gone = Clock::now();
  }
}

void Fabric::tick(Clock::time_point now) {
  for (auto& [num, qp] : qps) {
    if (qp->dead || qp->state != QpState::kConnected) continue;
    const auto notice = death_notice.count() > 0 ? death_notice : qp->peer_timeout;
    if (qp->peer_gone_set && now >= qp->peer_gone + notice) {
      // The transport's retries toward a dead peer run out.
      if (!qp->sq.empty()) {
        PendingSend p = std::move(qp->sq.front());
        qp->sq.pop_front();
        p.wr.flags |= kSignaled;
        complete_send(*qp, p, Status::kRetryExceeded);
      }
      to_error(*qp);
      continue;
    }
    if (!qp->sq.empty() && qp->sq.front().deadline != Clock::time_point{} &&
        now >= qp->sq.front().deadline) {
      PendingSend p = std::move(qp->sq.front());
      qp->sq.pop_front();
      p.wr.flags |= kSignaled;
      complete_send(*qp, p, Status::kRnrRetryExceeded);
      to_error(*qp);
      continue;
    }
    if (!qp->sq.empty()) progress(*qp);
  }
}

void Fabric::start_ticker() {
  std::lock_guard lock(mu);
  if (ticker_.joinable()) return;
  stop_ = false;
  ticker_ = std::thread([this] {
    std::unique_lock lock(mu);
    while (!stop_) {
      tick(Clock::now());
      cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  });
}

void Fabric::stop_ticker() {
  {
    std::lock_guard lock(mu);
    stop_ = true;
  }
  cv.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

}  // namespace rdmakit::fake
