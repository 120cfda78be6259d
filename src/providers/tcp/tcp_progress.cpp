#include "providers/tcp/tcp_progress.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/log.hpp"
#include "providers/tcp/tcp_qp.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SpinLock::lock() noexcept {
  for (int i = 0; !try_lock(); ++i) {
    if (i > 64) std::this_thread::yield();
  }
}

namespace {

constexpr int64_t kDefaultSpinUs = 20;
constexpr int64_t kMaxSpinUs = 10'000;

int64_t progress_spin_ns() noexcept {
  const char* env = std::getenv("RDMAKIT_TCP_PROGRESS_SPIN_US");
  if (env == nullptr) return kDefaultSpinUs * 1000;
  char* end = nullptr;
  errno = 0;
  const long long us = std::strtoll(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || us < 0 || us > kMaxSpinUs) {
    core::log().warn("tcp: RDMAKIT_TCP_PROGRESS_SPIN_US={:?} is not 0..{}: using {} us",
                     env, kMaxSpinUs, kDefaultSpinUs);
    return kDefaultSpinUs * 1000;
  }
  return us * 1000;
}

}  // namespace

TcpProgress::TcpProgress(bool progress_thread)
    : qp_num_((static_cast<uint32_t>(std::random_device{}()) & 0xffffu) | 0x10000u),
      with_thread_(progress_thread),
      spin_ns_(progress_spin_ns()) {
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  const int epoll_err = errno;
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_fd_ || !wake_fd_.get()) {
    const int err = !epoll_fd_ ? epoll_err : errno;
    throw Error("Context::open", "tcp", "", err, "epoll/eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // qp numbers are never 0
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  if (with_thread_) thread_ = rdmakit::detail::start_library_thread([this] { run(); });
  core::log().debug("tcp: context up ({} progress thread, spin {} us)",
                    with_thread_ ? "with" : "without", spin_ns_ / 1000);
}

TcpProgress::~TcpProgress() {
  stop_.store(true);
  kick();
  if (thread_.joinable()) thread_.join();
  epoll_fd_.reset();
  wake_fd_.reset();
}

void TcpProgress::kick() noexcept {
  const uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof one);
}

void TcpProgress::add_qp(TcpQp* qp) {
  std::lock_guard lock(mu_);
  qps_.push_back(qp);
  if (qp->socket_fd() >= 0) {
    epoll_event ev{};
    ev.events = TcpQp::kEpollEvents;
    ev.data.u64 = qp->qp_num();
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, qp->socket_fd(), &ev) == 0) {
      qp->ep_armed = true;
    }
  }
}

void TcpProgress::remove_qp(TcpQp* qp) noexcept {
  // Taking mu_ also waits for the thread to finish serving this QP.
  std::lock_guard lock(mu_);
  if (qp->socket_fd() >= 0)
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, qp->socket_fd(), nullptr);
  std::erase(qps_, qp);
}

void TcpProgress::deregister(MrEntry* e) noexcept {
  if (e == nullptr) return;
  MrTable::revoke(e);
  const int64_t start = now_ns();
  for (int i = 0; e->users.load(std::memory_order_seq_cst) != 0; ++i) {
    if (i < 100) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (i % 10 != 0) continue;
    // About every millisecond: cut the QPs that have held it past their
    // peer_timeout (one transfer is normally much shorter).
    const int64_t held = now_ns() - start;
    std::lock_guard lock(mu_);
    for (TcpQp* qp : qps_) qp->cut_if_pinning(e, held);
  }
  mrs_.free_slot(e);
}

void TcpProgress::run() noexcept {
  epoll_event events[64];
  int timeout_ms = 5;
  int64_t spin_until = 0;  // poll without sleeping until then
  int64_t now = now_ns();
  while (!stop_.load(std::memory_order_relaxed)) {
    const int n =
        ::epoll_wait(epoll_fd_.get(), events, 64, now < spin_until ? 0 : timeout_ms);
    std::lock_guard lock(mu_);
    now = now_ns();
    bool busy = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        uint64_t drained;
        [[maybe_unused]] auto r = ::read(wake_fd_.get(), &drained, sizeof drained);
        continue;
      }
      // Look the QP up by number: an event may outlive its QP.
      for (TcpQp* qp : qps_) {
        if (qp->qp_num() == events[i].data.u64) {
          qp->ep_event = true;  // the registration stays (edge-triggered)
          spin_until = now + spin_ns_;
          break;
        }
      }
    }
    for (TcpQp* qp : qps_) busy |= qp->thread_service(now, epoll_fd_.get());
    // A fast tick while some QP is skipped, stalled or blocked on output;
    // otherwise a slow one that still drives heartbeats and timeouts.
    timeout_ms = busy ? 1 : 5;
  }
}

}  // namespace rdmakit::tcp
