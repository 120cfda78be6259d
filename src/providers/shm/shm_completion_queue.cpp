#include "providers/shm/shm_completion_queue.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>

#include "providers/shm/asymmetric_fence.hpp"
#include "providers/shm/shm_queue_pair.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {

ShmCompletionQueue::ShmCompletionQueue(const CqOptions& options)
    : CompletionQueue(options) {
  if (options.capacity == 0) throw Error("create_cq", "shm", "", EINVAL, "capacity 0");
  const uint64_t size = std::bit_ceil(static_cast<uint64_t>(options.capacity));
  ring_.resize(size);
  mask_ = size - 1;
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  event_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!epoll_ || !event_ || !timer_) throw Error("create_cq", "shm", "", errno, "fds");
  for (int fd : {event_.get(), timer_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw Error("create_cq", "shm", "", errno, "epoll_ctl");
    }
  }
}

ShmCompletionQueue::~ShmCompletionQueue() = default;

void ShmCompletionQueue::reserve(uint32_t depth) {
  if (committed_ + depth > options().capacity) {
    throw Error("create_qp", "shm", "", EINVAL,
                "completion queue capacity " + std::to_string(options().capacity) +
                    " is smaller than the queue depths attached to it (" +
                    std::to_string(committed_ + depth) + ")");
  }
  committed_ += depth;
}

void ShmCompletionQueue::attach_send(ShmQueuePair* qp, uint32_t depth) {
  std::lock_guard lock(attach_mu_);
  reserve(depth);
  if (qp->options().thread_safe) multi_producer_ = true;
  send_qps_.push_back(qp);
}

void ShmCompletionQueue::attach_recv(ShmQueuePair* qp, uint32_t depth) {
  std::lock_guard lock(attach_mu_);
  reserve(depth);
  recv_qps_.push_back(qp);
}

void ShmCompletionQueue::detach(ShmQueuePair* qp) noexcept {
  std::lock_guard lock(attach_mu_);
  std::erase(send_qps_, qp);
  std::erase(recv_qps_, qp);
  next_recv_ = 0;  // the round-robin index must stay inside recv_qps_
  // Completions of a destroyed QP must not touch it when polled.
  const ProducerGuard guard(*this);
  for (uint64_t i = head_; i != tail_; ++i) {
    if (ring_[i & mask_].qp == qp) ring_[i & mask_].qp = nullptr;
  }
  committed_ -= std::min<uint64_t>(committed_, qp->options().max_send_wr);
  committed_ -= std::min<uint64_t>(committed_, qp->options().max_recv_wr);
}

void ShmCompletionQueue::lock_ring() noexcept {
  while (ring_lock_.exchange(true, std::memory_order_acquire)) {
    while (ring_lock_.load(std::memory_order_relaxed)) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
}

void ShmCompletionQueue::disarm() noexcept {
  armed_ = false;
  for (ShmQueuePair* qp : recv_qps_) qp->set_cq_armed(false);
}

int ShmCompletionQueue::poll(std::span<Completion> out) noexcept {
  if (armed_) disarm();
  for (ShmQueuePair* qp : send_qps_) {
    if (qp->needs_progress()) qp->progress();
  }
  size_t n = 0;
  {
    const ProducerGuard guard(*this);
    while (n < out.size() && head_ != tail_) {
      const Entry& e = ring_[head_ & mask_];
      out[n++] = e.completion;
      if (e.qp != nullptr && e.retire_to != 0) e.qp->retire(e.retire_to);
      ++head_;
    }
  }
  const size_t qps = recv_qps_.size();
  size_t at = next_recv_;
  for (size_t i = 0; i < qps && n < out.size(); ++i) {
    n += static_cast<size_t>(recv_qps_[at]->poll_recv(out.subspan(n)));
    if (++at == qps) at = 0;
  }
  if (++next_recv_ >= qps) next_recv_ = 0;
  return static_cast<int>(n);
}

bool ShmCompletionQueue::arm() noexcept {
  uint64_t drained;
  while (::read(event_.get(), &drained, sizeof drained) > 0) {
  }
  while (::read(timer_.get(), &drained, sizeof drained) > 0) {
  }
  armed_ = true;
  for (ShmQueuePair* qp : recv_qps_) qp->set_cq_armed(true);
  // Senders that publish with a release store rely on this barrier.
  if (!recv_qps_.empty() && asymmetric_fence_available()) heavy_fence();
  // Re-check after arming (the fi_trywait rule): anything that became ready
  // before the peer saw the armed flag is caught here.
  bool pending;
  {
    const ProducerGuard guard(*this);
    pending = head_ != tail_;
  }
  bool paced = false;
  for (ShmQueuePair* qp : recv_qps_) pending = pending || qp->recv_ready();
  for (ShmQueuePair* qp : send_qps_) {
    if (qp->send_ready()) pending = true;
    if (qp->rnr_waiting()) paced = true;
  }
  if (pending) {
    disarm();
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
