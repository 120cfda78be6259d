// The Worker's progress loop: construction (CQ, epoll set, wake-up and
// heartbeat fds), endpoint slots and adoption, one pass of the loop (poll or
// wait by event mode), and the library thread that runs it.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include "channel_core.hpp"
#include "engine.hpp"
#include "rdmakit/detail/library_thread.hpp"

namespace rdmakit::session::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
int add_fd(int epfd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}
}  // namespace

Worker::Worker(Engine& engine, bool threaded, uint32_t capacity)
    : engine_(engine), threaded_(threaded), capacity_(capacity) {
  const SessionOptions& o = engine.options();
  const QpOptions q = engine.qp_options(nullptr);
  const auto channels = static_cast<uint32_t>(std::max<size_t>(1, o.channels.size()));
  CqOptions cq_options;
  cq_options.capacity = capacity * channels * (q.max_send_wr + q.max_recv_wr);
  cq_ = engine.ctx().create_cq(cq_options);
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0 || timer_fd_ < 0 || add_fd(epfd_, cq_->fd()) != 0 ||
      add_fd(epfd_, wake_fd_) != 0 || add_fd(epfd_, timer_fd_) != 0) {
    const int err = errno;
    throw Error("session worker", engine.ctx().provider_name(), "", err,
                std::string("epoll/eventfd/timerfd setup: ") + std::strerror(err));
  }
  // The timer paces heartbeats for a loop sleeping in epoll (application
  // epoll loops included).
  itimerspec period{};
  period.it_interval.tv_sec = o.heartbeat.count() / 1000;
  period.it_interval.tv_nsec = (o.heartbeat.count() % 1000) * 1000000;
  period.it_value = period.it_interval;
  timerfd_settime(timer_fd_, 0, &period, nullptr);

  owners_.resize(capacity);
  slot_ptr_ = std::make_unique<std::atomic<Endpoint*>[]>(capacity);
  slot_gen_ = std::make_unique<std::atomic<uint16_t>[]>(capacity);
  for (uint32_t i = capacity; i > 0; --i) free_slots_.push_back(i - 1);
}

Worker::~Worker() {
  stop();
  for (int fd : {epfd_, wake_fd_, timer_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

Listener* Worker::channel_listener() {
  std::lock_guard lock(listener_mu_);
  if (!channel_listener_) {
    channel_listener_ = engine_.ctx().listen(engine_.listen_host() + ":0");
  }
  return channel_listener_.get();
}

bool Worker::reserve(const std::shared_ptr<Endpoint>& ep) {
  std::lock_guard lock(slots_mu_);
  if (free_slots_.empty()) return false;
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  const auto gen = static_cast<uint16_t>(slot_gen_[slot].load() + 1);
  slot_gen_[slot].store(gen);
  ep->slot_ = slot;
  ep->generation_ = gen;
  ep->worker_ = this;
  owners_[slot] = ep;
  slot_ptr_[slot].store(ep.get(), std::memory_order_release);
  return true;
}

void Worker::adopt(std::shared_ptr<Endpoint> ep) {
  {
    std::lock_guard lock(inbox_mu_);
    if (retire_when_idle_) served_endpoints_.push_back(ep);
    inbox_.push_back(std::move(ep));
  }
  inbox_pending_.store(true);
  wake();
}

void Worker::wake() noexcept {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

void Worker::drain_fds() noexcept {
  uint64_t v;
  while (::read(wake_fd_, &v, sizeof v) > 0) {
  }
  while (::read(timer_fd_, &v, sizeof v) > 0) {
  }
}

bool Worker::on_worker_thread() const noexcept {
  return threaded_ && thread_id_.load() == std::this_thread::get_id();
}

bool Worker::arm() noexcept {
  if (inbox_pending_.load() || close_pending_.load()) return false;
  return cq_->arm();
}

void Worker::adopt_pending() {
  std::vector<std::shared_ptr<Endpoint>> batch;
  {
    std::lock_guard lock(inbox_mu_);
    batch.swap(inbox_);
    inbox_pending_.store(false);
  }
  const auto now = Clock::now();
  if (!batch.empty()) served_ = true;
  for (auto& ep : batch) {
    ++live_;
    ep->heartbeat_changed_ = now;
    std::string why;
    for (auto& ch : ep->channels_) {
      if (!ch->post_initial_recvs(&why)) break;
    }
    if (why.empty()) {
      const Table table = engine_.table_for(*ep);
      const std::vector<std::byte> blob = encode(table);
      if (!ep->channels_[0]->send_control(MsgKind::kTable, blob)) {
        why = "sending the buffer table failed (" + std::to_string(blob.size()) +
              " bytes; the peer's max_message is " +
              std::to_string(ep->channels_[0]->max_message()) + ")";
      }
    }
    if (!why.empty()) kill(*ep, {DisconnectReason::kTransportError, why});
  }
}

int Worker::run_once(milliseconds timeout) { return pass(timeout, true); }

int Worker::poll_pass() { return pass(milliseconds(0), false); }

int Worker::pass(milliseconds timeout, bool clock_when_idle) {
  if (inbox_pending_.load(std::memory_order_relaxed)) adopt_pending();
  int n = 0;
  if (depth_ == 0) {
    ++depth_;
    struct Leave {
      uint32_t& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    n = wait_and_poll(batch_, timeout);
    dispatch_all(batch_, n);
  } else {
    std::array<Completion, kBatch> nested;
    n = wait_and_poll(nested, timeout);
    dispatch_all(nested, n);
  }
  if (!flush_wait_.empty()) settle_flushes(Clock::now());
  // The clock is read when idle and every 64 busy passes, not per message.
  if ((n == 0 && clock_when_idle) || ++polls_since_clock_ >= 64) {
    polls_since_clock_ = 0;
    const auto now = Clock::now();
    if (now >= next_tick_ || close_pending_.load(std::memory_order_relaxed)) tick(now);
    if (!graves_.empty()) reap(now, false);
  }
  return n;
}

int Worker::wait_and_poll(std::span<Completion> batch, milliseconds timeout) {
  int n = cq_->poll(batch);
  if (n != 0 || timeout.count() <= 0) return n;
  switch (engine_.options().event_mode) {
    case EventMode::kBusyPoll: {
      // The clock is read every 1024 empty polls (tens of microseconds), not
      // between every two: a message that arrives while the clock is read
      // waits for it. None at all when a completion comes within the first
      // 1024 (the deadline is late by as much, at most).
      Clock::time_point deadline{};
      for (uint32_t spins = 1; n == 0; ++spins) {
        if ((spins & 1023) == 0) {
          const auto now = Clock::now();
          if (spins == 1024) deadline = now + timeout;
          if (now >= deadline || inbox_pending_.load() || close_pending_.load()) break;
        }
        n = cq_->poll(batch);
      }
      break;
    }
    case EventMode::kBlocking:
    case EventMode::kEpollFd: {
      // Blocking spins for the CQ's budget first (as CompletionQueue::wait),
      // then sleeps in epoll like the epoll mode: the set holds the wake-up
      // eventfd, so a close(), a new endpoint or stop() wakes the loop at
      // once instead of after a timed slice.
      if (engine_.options().event_mode == EventMode::kBlocking) {
        const auto spin_until = Clock::now() + cq_->options().spin;
        do {
          if ((n = cq_->poll(batch)) != 0) return n;
        } while (Clock::now() < spin_until && !inbox_pending_.load() &&
                 !close_pending_.load() && !stop_.load(std::memory_order_relaxed));
      }
      if (!stop_.load(std::memory_order_relaxed) && arm()) {
        epoll_event events[4];
        const auto ms =
            static_cast<int>(std::min(timeout, engine_.options().heartbeat).count());
        epoll_wait(epfd_, events, 4, ms);
      }
      drain_fds();
      n = cq_->poll(batch);
      break;
    }
  }
  return n;
}

void Worker::loop() {
  thread_id_.store(std::this_thread::get_id());
  const milliseconds slice = engine_.options().event_mode == EventMode::kBusyPoll
                                 ? milliseconds(0)
                                 : engine_.options().heartbeat;
  while (!stop_.load(std::memory_order_relaxed)) {
    run_once(slice);
    // Served, closed and reaped: nothing more can come to this worker (one
    // endpoint per worker), so its thread ends here rather than idling until
    // the session ends. It is joined by the Engine, never from itself.
    if (retire_when_idle_ && served_ && live_.load() == 0 && graves_.empty() &&
        !inbox_pending_.load()) {
      retired_.store(true, std::memory_order_release);
      return;
    }
  }
}

bool Worker::endpoints_gone() const {
  std::lock_guard lock(inbox_mu_);
  return std::all_of(served_endpoints_.begin(), served_endpoints_.end(),
                     [](const std::weak_ptr<Endpoint>& w) { return w.expired(); });
}

void Worker::start() {
  if (threaded_ && !thread_.joinable())
    thread_ = rdmakit::detail::start_library_thread([this] { loop(); });
}

void Worker::stop() {
  stop_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdmakit::session::detail
