#include "providers/shm/shm_cq.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <type_traits>
#include <utility>

#include "providers/shm/shm_asymmetric_fence.hpp"
#include "providers/shm/shm_qp.hpp"
#include "rdmakit/detail/spin.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {

ShmCq::ShmCq(const CqOptions& options)
    : CompletionQueue(options),
      strong_gate_(kThreadSanitizer || !asymmetric_fence_available()) {
  if (options.capacity == 0) throw Error("create_cq", "shm", "", EINVAL, "capacity 0");
  budget_ = core::CqBudget(options.capacity);
  const uint64_t size = std::bit_ceil(static_cast<uint64_t>(options.capacity));
  // An aggregate of trivial members: calloc's zeroed storage is a valid
  // array of them (implicit object creation).
  static_assert(std::is_trivially_copyable_v<Entry> &&
                std::is_trivially_destructible_v<Entry>);
  ring_.reset(static_cast<Entry*>(std::calloc(size, sizeof(Entry))));
  if (!ring_) throw Error("create_cq", "shm", "", ENOMEM, "completion ring");
  mask_ = size - 1;
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  event_ = std::make_shared<const Fd>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  int wake[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, wake) != 0)
    throw Error("create_cq", "shm", "", errno, "socketpair(wake)");
  wake_rx_.reset(wake[0]);
  wake_tx_.reset(wake[1]);
  if (!epoll_ || !*event_ || !timer_) throw Error("create_cq", "shm", "", errno, "fds");
  for (int fd : {event_->get(), timer_.get(), wake_rx_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw Error("create_cq", "shm", "", errno, "epoll_ctl");
    }
  }
}

ShmCq::~ShmCq() = default;

void ShmCq::reserve(uint32_t depth) { budget_.charge(depth, "create_qp", "shm", ""); }

// ---------------------------------------------------------------- owner gate

void ShmCq::wake_if_armed() noexcept {
  if (!armed_.load(std::memory_order_acquire)) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_->get(), &one, sizeof one);
}

void ShmCq::wake_if_armed_after_queueing() noexcept {
  // A read-modify-write orders the queueing before this read (the store-load
  // order a plain load lacks; a fence TSan also understands). It writes
  // nothing new: false stays false, and a true fails the exchange.
  bool armed = false;
  armed_.compare_exchange_strong(armed, false, std::memory_order_seq_cst);
  if (!armed) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_->get(), &one, sizeof one);
}

void ShmCq::wait_gate_open() const noexcept {
  detail::spin_until([this] { return !gate_closed_.load(std::memory_order_acquire); });
}

void ShmCq::close_gate() noexcept {
  if (strong_gate_) {
    gate_closed_.store(true, std::memory_order_seq_cst);
  } else {
    gate_closed_.store(true, std::memory_order_relaxed);
    heavy_fence();
  }
  const uint64_t seen = owner_epoch_.load(strong_gate_ ? std::memory_order_seq_cst
                                                       : std::memory_order_acquire);
  if ((seen & 1) == 0) return;
  // The owner is inside poll() or arm(); neither blocks.
  detail::spin_until(
      [this, seen] { return owner_epoch_.load(std::memory_order_acquire) != seen; });
}

// ------------------------------------------------------------ attach/detach

void ShmCq::attach(ShmQp* qp, uint32_t depth, bool send) {
  std::lock_guard lock(attach_mu_);
  reserve(depth);
  close_gate();
  try {
    (send ? send_qps_ : recv_qps_).push_back(qp);
    // The poll adds to hot_ without allocating. Doubling: a reserve of the
    // exact size per attach left a trail of freed buffers (1.2 KiB of heap
    // per stream with 1,000 streams on one engine).
    if (!send && hot_.capacity() < recv_qps_.size())
      hot_.reserve(std::max<size_t>(recv_qps_.size(), 2 * hot_.capacity()));
  } catch (...) {
    std::erase(send ? send_qps_ : recv_qps_, qp);
    budget_.refund(depth);
    open_gate();
    throw;
  }
  if (send && qp->options().thread_safe)
    multi_producer_.store(true, std::memory_order_relaxed);
  if (!send && armed_.load(std::memory_order_relaxed)) {
    // The owner sleeps armed, but not on this QP: wake it to re-arm.
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_->get(), &one, sizeof one);
  }
  open_gate();
}

void ShmCq::attach_send(ShmQp* qp, uint32_t depth) { attach(qp, depth, true); }

void ShmCq::attach_recv(ShmQp* qp, uint32_t depth) { attach(qp, depth, false); }

void ShmCq::detach(ShmQp* qp) noexcept {
  std::lock_guard lock(attach_mu_);
  const bool sends = std::find(send_qps_.begin(), send_qps_.end(), qp) != send_qps_.end();
  const bool recvs = std::find(recv_qps_.begin(), recv_qps_.end(), qp) != recv_qps_.end();
  if (!sends && !recvs) return;  // a QP whose send and recv CQ are this one: done
  close_gate();
  std::erase(send_qps_, qp);
  std::erase(recv_qps_, qp);
  std::erase(hot_, qp);
  qp->cq_hot = false;
  next_recv_ = 0;  // the round-robin indices must stay inside the lists
  next_send_ = 0;
  // Its completions still in the ring are dropped, as a NIC cleans its CQ at
  // ibv_destroy_qp: polling them would touch the freed QP, and the capacity
  // they hold is given back below. With the gate closed the owner neither
  // polls nor pushes; other producers push under the ring lock.
  lock_ring();
  uint64_t kept = head_;
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  for (uint64_t i = head_; i != tail; ++i) {
    if (ring_[i & mask_].qp != qp) {
      if (kept != i) ring_[kept & mask_] = ring_[i & mask_];
      ++kept;
    }
  }
  tail_.store(kept, std::memory_order_relaxed);
  ring_lock_.store(false, std::memory_order_release);
  open_gate();
  // What this CQ reserved for the QP (each side once).
  if (sends) budget_.refund(qp->options().max_send_wr);
  if (recvs) budget_.refund(qp->options().max_recv_wr);
}

void ShmCq::lock_ring() noexcept {
  detail::SpinBackoff backoff;
  while (ring_lock_.exchange(true, std::memory_order_acquire)) {
    while (ring_lock_.load(std::memory_order_relaxed)) backoff.pause();
  }
}

void ShmCq::disarm() noexcept {
  armed_.store(false, std::memory_order_relaxed);
  for (ShmQp* qp : recv_qps_) qp->set_cq_armed(false);
}

void ShmCq::note_hit(ShmQp* qp) noexcept {
  qp->cq_last_hit = polls_;
  if (!qp->cq_hot) {
    qp->cq_hot = true;
    hot_.push_back(qp);  // never reallocates: capacity >= recv_qps_.size()
  }
}

int ShmCq::poll(std::span<Completion> out) noexcept {
  const OwnerSection section(*this);
  if (!section.entered()) return 0;  // a QP is being attached or detached
  ++polls_;
  bool visit_all = std::exchange(visit_all_next_, false);
  if (armed_.load(std::memory_order_relaxed)) {
    disarm();
    visit_all = true;
  }
  if (visit_all || send_qps_.size() <= kScanAll) {
    for (ShmQp* qp : send_qps_) {
      if (qp->needs_progress()) qp->progress();
    }
  } else {
    for (size_t i = 0; i < kColdSlice; ++i) {
      ShmQp* qp = send_qps_[next_send_];
      if (++next_send_ >= send_qps_.size()) next_send_ = 0;
      if (qp->needs_progress()) qp->progress();
    }
  }
  size_t n = 0;
  // A push in progress is seen by the next poll; the ring lock is taken only
  // when there is something to take (every poll of a spinning reader
  // otherwise paid it).
  if (head_ != tail_.load(std::memory_order_relaxed)) {
    const ProducerGuard guard(*this);
    while (n < out.size() && head_ != tail_.load(std::memory_order_relaxed)) {
      const Entry& e = ring_[head_ & mask_];
      out[n++] = e.completion;
      if (e.qp != nullptr && e.retire_to != 0) e.qp->retire(e.retire_to);
      ++head_;
    }
  }
  const size_t qps = recv_qps_.size();
  if (visit_all || qps <= kScanAll) {
    size_t at = next_recv_;
    for (size_t i = 0; i < qps && n < out.size(); ++i) {
      const int got = recv_qps_[at]->poll_recv(out.subspan(n));
      if (got > 0 && qps > kScanAll) note_hit(recv_qps_[at]);
      n += static_cast<size_t>(got);
      if (++at == qps) at = 0;
    }
    if (++next_recv_ >= qps) next_recv_ = 0;
    return static_cast<int>(n);
  }
  for (size_t i = 0; i < hot_.size() && n < out.size();) {
    ShmQp* qp = hot_[i];
    const int got = qp->poll_recv(out.subspan(n));
    if (got > 0) {
      n += static_cast<size_t>(got);
      qp->cq_last_hit = polls_;
    } else if (polls_ - qp->cq_last_hit > kHotPolls) {
      qp->cq_hot = false;  // cold again: seen in the slices only
      hot_[i] = hot_.back();
      hot_.pop_back();
      continue;
    }
    ++i;
  }
  for (size_t i = 0; i < kColdSlice && n < out.size(); ++i) {
    ShmQp* qp = recv_qps_[next_recv_];
    if (++next_recv_ >= qps) next_recv_ = 0;  // stays a valid index for either path
    if (qp->cq_hot) continue;
    const int got = qp->poll_recv(out.subspan(n));
    if (got > 0) {
      n += static_cast<size_t>(got);
      note_hit(qp);
    }
  }
  return static_cast<int>(n);
}

bool ShmCq::arm() noexcept {
  const OwnerSection section(*this);
  if (!section.entered()) {
    // The QP lists are changing: poll again once they are. Waiting here
    // (not in the caller's loop) lets a preempted attach() finish first.
    wait_gate_open();
    return false;
  }
  uint64_t drained;
  while (::read(event_->get(), &drained, sizeof drained) > 0) {
  }
  while (::read(timer_.get(), &drained, sizeof drained) > 0) {
  }
  // Bounded: a peer may keep sending; what is left keeps fd() readable.
  char byte;
  for (int i = 0; i < 64 && ::recv(wake_rx_.get(), &byte, 1, MSG_DONTWAIT) >= 0; ++i) {
  }
  armed_.store(true, std::memory_order_relaxed);
  for (ShmQp* qp : recv_qps_) qp->set_cq_armed(true);
  // Senders that publish with a release store rely on this barrier.
  if (!recv_qps_.empty() && asymmetric_fence_available()) heavy_fence();
  // Re-check after arming (the fi_trywait rule): anything that became ready
  // before the peer saw the armed flag is caught here.
  bool pending;
  {
    const ProducerGuard guard(*this);
    pending = head_ != tail_.load(std::memory_order_relaxed);
  }
  bool paced = false;
  for (ShmQp* qp : recv_qps_) pending = pending || qp->recv_ready();
  for (ShmQp* qp : send_qps_) {
    if (qp->send_ready()) pending = true;
    if (qp->rnr_waiting()) paced = true;
  }
  if (pending) {
    disarm();
    // The owner polls next for what arm() saw, which may be on a QP a
    // partial poll would reach only after many polls (each with an arm()).
    visit_all_next_ = true;
    return false;
  }
  if (paced) {
    // An RNR-blocked SEND needs retries while the thread sleeps.
    itimerspec spec{};
    spec.it_value.tv_nsec = 1'000'000;
    ::timerfd_settime(timer_.get(), 0, &spec, nullptr);
  }
  return true;
}

}  // namespace rdmakit::shm
