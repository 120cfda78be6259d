#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include "engine.hpp"
#include "log.hpp"

namespace rdmakit::session::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
// A goodbye gets at most this long to leave before the QP that carries it is
// destroyed; its completion ends the wait sooner.
constexpr milliseconds kLinger{100};
// How long a cause-less flush waits for the peer's goodbye (Worker::flush_wait_).
constexpr milliseconds kFlushGrace{20};

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
      if (!EndpointSetup::post_initial_recvs(*ch, &why)) break;
    }
    if (why.empty()) {
      const Table table = engine_.table_for(*ep);
      const std::vector<std::byte> blob = encode(table);
      if (!EndpointSetup::send_control(*ep->channels_[0], MsgKind::kTable, blob)) {
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
  Channel& ch = *ep->channels_[index];
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
      Channel::Pending p;
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
  if (c.status != Status::kWrFlushError) {
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
      ep.channels_[i]->name_ = table->channel_names[i];
    }
  }
  ep.remote_buffers_ = std::move(table->buffers);
  ep.heartbeat_changed_ = Clock::now();
  ep.state_.store(Endpoint::State::kReady);
  if (engine_.handlers().on_connect) engine_.handlers().on_connect(ep);
}

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
    Channel& ch = *ep->channels_[0];
    std::lock_guard lock(ch.mu_);
    if (ch.closed_) continue;
    const uint64_t value = ++ep->heartbeat_sent_;
    SendWr wr{.wr_id = make_wr_id(ep->slot_, ep->generation_, 0, WrKind::kInternal, 1),
              .opcode = Opcode::kWrite,
              .flags = kSignaled | kInline,
              .length = sizeof value,
              .local_addr = const_cast<uint64_t*>(&value),
              .remote_addr = ep->peer_ctrl_.addr_at(kCtrlHeartbeat),
              .rkey = ep->peer_ctrl_.rkey};
    (void)ch.qp_->post_send(wr);  // a failure completes with an error status
  }
}

// Takes the endpoint down: goodbye (local close), pending operations fail,
// pull receivers wake, on_disconnect runs; the QPs go after a short linger.
void Worker::kill(Endpoint& ep, DisconnectInfo info) {
  const Endpoint::State before = ep.state_.load();
  if (before == Endpoint::State::kClosed) return;
  uint64_t goodbye = 0;
  if (info.reason == DisconnectReason::kLocalClose &&
      !EndpointSetup::send_control(*ep.channels_[0], MsgKind::kGoodbye, {}, &goodbye)) {
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
  if (threaded_ && !thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void Worker::stop() {
  stop_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
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
