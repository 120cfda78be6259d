// Queue pair data path: one preallocated postlist, one ibv_post_send.
#include "providers/verbs/verbs_qp.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>

#include "core/work_request.hpp"
#include "providers/verbs/verbs_cq.hpp"
#include "providers/verbs/verbs_srq.hpp"

namespace rdmakit::verbs {
namespace {

// IB encoding of the RNR NAK delay (min_rnr_timer), in microseconds; index 0
// means 655.36 ms and is left out on purpose.
constexpr uint32_t kRnrTimerMicros[32] = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

PostStatus map_post_errno(int err) noexcept {
  return err == ENOMEM ? PostStatus::kQueueFull : PostStatus::kInvalidArgument;
}

uint64_t ring_size(uint32_t depth) { return std::bit_ceil(std::max<uint64_t>(depth, 1)); }

}  // namespace

QpCore::QpCore(uint32_t qp_num_in, uint32_t send_depth_in, uint32_t recv_depth_in)
    : qp_num(qp_num_in),
      send_depth(send_depth_in),
      recv_depth(recv_depth_in),
      send_mask(ring_size(send_depth_in) - 1),
      recv_mask(ring_size(recv_depth_in) - 1),
      send_ring(ring_size(send_depth_in)),
      recv_ring(ring_size(recv_depth_in)) {}

RetrySettings retry_settings(const QpOptions& options) noexcept {
  RetrySettings s;
  // Dead peer: (retry_cnt + 1) ACK timeouts of 4.096 us * 2^timeout each; the
  // largest exponent whose total stays within peer_timeout (at least 1: 0
  // would mean "wait forever").
  s.retry_cnt = 3;
  const double per_try_us =
      std::max<double>(1.0, static_cast<double>(options.peer_timeout.count()) * 1000.0 /
                                (s.retry_cnt + 1));
  const int exponent = static_cast<int>(std::floor(std::log2(per_try_us / 4.096)));
  s.timeout = static_cast<uint8_t>(std::clamp(exponent, 1, 31));
  // RNR: 6 retries (7 would be "forever"), each after the delay we ask the
  // peer to wait; pick the largest delay whose 7 waits fit rnr_timeout.
  s.rnr_retry = 6;
  const double per_rnr_us = static_cast<double>(options.rnr_timeout.count()) * 1000.0 / 7;
  s.min_rnr_timer = 1;
  for (uint8_t code = 1; code < 32; ++code) {
    if (kRnrTimerMicros[code] <= per_rnr_us) s.min_rnr_timer = code;
  }
  return s;
}

CqAttachment::CqAttachment(VerbsCq* send_cq, VerbsCq* recv_cq, QpCore* core,
                           std::shared_ptr<SrqCore> srq, const std::string& peer)
    : send_cq_(send_cq), recv_cq_(recv_cq), core_(core), srq_(std::move(srq)) {
  send_cq_->attach(core_, core_->send_depth, peer);
  try {
    if (srq_) {
      recv_cq_->attach_srq(core_, srq_, peer);
    } else {
      recv_cq_->attach(core_, core_->recv_depth, peer);
    }
  } catch (...) {
    send_cq_->detach(core_, core_->send_depth);
    throw;
  }
}

CqAttachment::~CqAttachment() {
  send_cq_->detach(core_, core_->send_depth);
  if (srq_) {
    recv_cq_->detach_srq(core_, srq_.get());
  } else {
    recv_cq_->detach(core_, core_->recv_depth);
  }
}

VerbsQp::VerbsQp(std::shared_ptr<Device> device, CmIdHandle id, Parts parts,
                 std::string peer, std::vector<std::byte> peer_private_data,
                 std::shared_ptr<ConnState> conn)
    : QueuePair(parts.qp->qp_num, parts.options, std::move(peer),
                std::move(peer_private_data)),
      device_(std::move(device)),
      id_(std::move(id)),
      qp_(std::move(parts.qp)),
      core_(std::move(parts.core)),
      srq_(std::move(parts.srq)),
      attachment_(std::move(parts.attachment)),
      conn_(std::move(conn)),
      handshake_buf_(std::move(parts.handshake_buf)),
      handshake_mr_(std::move(parts.handshake_mr)),
      send_wrs_(core_->send_depth),
      send_sges_(core_->send_depth),
      recv_wrs_(core_->recv_depth),
      recv_sges_(core_->recv_depth) {}

VerbsQp::~VerbsQp() {
  if (device_->progress_thread) device_->progress_thread->release(id_.get());
  // DREQ to the peer: its QP flushes promptly instead of timing out.
  rdma_disconnect(id_.get());
  qp_.reset();
  attachment_.reset();
  id_.reset();  // after the QP: rdma_cm does not own a QP it did not create
}

QpState VerbsQp::state() const noexcept {
  // A peer that disconnected or died leaves this QP unusable: an error, as
  // after any failed work request.
  if (conn_->disconnected.load(std::memory_order_acquire)) return QpState::kError;
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(qp_.get(), &attr, IBV_QP_STATE, &init) != 0) return QpState::kError;
  switch (attr.qp_state) {
    case IBV_QPS_RTS:
    case IBV_QPS_SQD: return QpState::kConnected;
    default: return QpState::kError;
  }
}

PostResult VerbsQp::do_post_send(std::span<const SendWr> wrs) noexcept {
  const detail::ConditionalLock lock(post_mutex_, options().thread_safe);
  return post_send_locked(wrs);
}

PostResult VerbsQp::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  // Its receives come from the SRQ (SharedReceiveQueue::post_recv).
  if (srq_) return {PostStatus::kInvalidArgument, 0};
  const detail::ConditionalLock lock(post_mutex_, options().thread_safe);
  return post_recv_locked(wrs);
}

PostResult VerbsQp::post_send_locked(std::span<const SendWr> wrs) noexcept {
  QpCore& core = *core_;
  if (wrs.empty()) return {};
  const uint64_t outstanding =
      core.send_posted - core.send_retired.load(std::memory_order_acquire);
  const size_t room = core.send_depth - outstanding;
  PostStatus status = wrs.size() > room ? PostStatus::kQueueFull : PostStatus::kOk;
  size_t n = std::min(wrs.size(), room);
  for (size_t i = 0; i < n; ++i) {
    const SendWr& in = wrs[i];
    // Refused here, not by the device, so every provider refuses the same.
    if (const PostStatus bad = core::validate_send(in, options().max_inline);
        bad != PostStatus::kOk) {
      status = bad;
      n = i;
      break;
    }
    ibv_send_wr& wr = send_wrs_[i];
    ibv_sge& sge = send_sges_[i];
    wr = ibv_send_wr{};
    sge.addr = reinterpret_cast<uint64_t>(in.local_addr);
    sge.length = in.length;
    sge.lkey = in.lkey;
    wr.sg_list = &sge;
    wr.num_sge = in.length == 0 ? 0 : 1;
    wr.wr_id = core.send_posted + i;
    wr.next = i + 1 < n ? &send_wrs_[i + 1] : nullptr;
    switch (in.opcode) {
      case Opcode::kSend: wr.opcode = IBV_WR_SEND; break;
      case Opcode::kSendWithImm: wr.opcode = IBV_WR_SEND_WITH_IMM; break;
      case Opcode::kWrite: wr.opcode = IBV_WR_RDMA_WRITE; break;
      case Opcode::kWriteWithImm: wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; break;
      case Opcode::kRead: wr.opcode = IBV_WR_RDMA_READ; break;
      case Opcode::kCompareSwap: wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP; break;
      default: wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD; break;  // validated above
    }
    if (core::is_atomic(in.opcode)) {
      wr.wr.atomic.remote_addr = in.remote_addr;
      wr.wr.atomic.rkey = in.rkey;
      wr.wr.atomic.compare_add = in.compare_add;
      wr.wr.atomic.swap = in.swap;
    } else {
      wr.wr.rdma.remote_addr = in.remote_addr;
      wr.wr.rdma.rkey = in.rkey;
    }
    if (core::has_imm(in.opcode)) wr.imm_data = htonl(in.imm);
    if (in.flags & kSignaled) wr.send_flags |= IBV_SEND_SIGNALED;
    if (in.flags & kFence) wr.send_flags |= IBV_SEND_FENCE;
    if (in.flags & kInline) wr.send_flags |= IBV_SEND_INLINE;
    core.send_ring[(core.send_posted + i) & core.send_mask] = {in.wr_id, in.opcode};
  }
  if (n == 0) return {status, 0};
  send_wrs_[n - 1].next = nullptr;
  core.send_published.store(core.send_posted + n, std::memory_order_release);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_.get(), send_wrs_.data(), &bad); rc != 0) {
    const size_t accepted =
        bad != nullptr ? static_cast<size_t>(bad - send_wrs_.data()) : 0;
    core.send_posted += accepted;
    return {map_post_errno(rc), static_cast<uint32_t>(accepted)};
  }
  core.send_posted += n;
  return {status, static_cast<uint32_t>(n)};
}

PostResult VerbsQp::post_recv_locked(std::span<const RecvWr> wrs) noexcept {
  QpCore& core = *core_;
  if (wrs.empty()) return {};
  const uint64_t outstanding =
      core.recv_posted - core.recv_retired.load(std::memory_order_acquire);
  const size_t room = core.recv_depth - outstanding;
  const PostStatus status = wrs.size() > room ? PostStatus::kQueueFull : PostStatus::kOk;
  const size_t n = std::min(wrs.size(), room);
  if (n == 0) return {status, 0};
  for (size_t i = 0; i < n; ++i) {
    const RecvWr& in = wrs[i];
    ibv_recv_wr& wr = recv_wrs_[i];
    ibv_sge& sge = recv_sges_[i];
    sge.addr = reinterpret_cast<uint64_t>(in.addr);
    sge.length = in.length;
    sge.lkey = in.lkey;
    wr.wr_id = QpCore::kRecvBit | (core.recv_posted + i);
    wr.sg_list = &sge;
    wr.num_sge = in.length == 0 ? 0 : 1;
    wr.next = i + 1 < n ? &recv_wrs_[i + 1] : nullptr;
    core.recv_ring[(core.recv_posted + i) & core.recv_mask] = in.wr_id;
  }
  core.recv_published.store(core.recv_posted + n, std::memory_order_release);
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(qp_.get(), recv_wrs_.data(), &bad); rc != 0) {
    const size_t accepted =
        bad != nullptr ? static_cast<size_t>(bad - recv_wrs_.data()) : 0;
    core.recv_posted += accepted;
    return {map_post_errno(rc), static_cast<uint32_t>(accepted)};
  }
  core.recv_posted += n;
  // A device flushes the receive queue when the QP enters the error state,
  // but need not flush RECVs posted after that: rxe's user-space post_recv
  // never enters the kernel, and its responder drains only when it next
  // runs, which for a QP whose peer is gone is never. Entering the error
  // state again (ERR -> ERR is allowed) makes it drain now, so these RECVs
  // complete with WR_FLUSH_ERROR as on a NIC. Cold path: only after the
  // peer left or a completion of this QP failed.
  // A read-modify-write, not a load: it reads the latest value of the flag
  // and is a full barrier, so the device's producer-index store of
  // ibv_post_recv is ordered before the check (a seq_cst load alone does
  // not order an earlier plain store): either the poster sees the flag, or
  // the side that set it moves the QP to the error state after these RECVs.
  // (Not a fence: ThreadSanitizer does not support atomic_thread_fence.)
  bool gone = false;
  conn_->disconnected.compare_exchange_strong(gone, false, std::memory_order_seq_cst);
  if (gone || core.failed.load(std::memory_order_seq_cst)) {
    flush_in_error();
  }
  return {status, static_cast<uint32_t>(n)};
}

void VerbsQp::flush_in_error() noexcept {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int rc = ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE); rc != 0) {
    log_release_failure("ibv_modify_qp to ERR (flush of RECVs posted in error)", rc);
  }
}

}  // namespace rdmakit::verbs
