// Region table, progress thread and completion queue of the tcp provider.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/log.hpp"
#include "providers/tcp/tcp_provider.hpp"
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

// ---------------------------------------------------------------- MrTable

MrTable::MrTable() : slots_(new MrEntry[kSlots]) { new_secret(); }

uint64_t MrTable::random64() {
  if (deterministic_) return test_rng_();
  return (uint64_t{random_()} << 32) | random_();
}

void MrTable::new_secret() {
  for (uint64_t& k : secret_) k = random64();
}

// Feistel round function: a keyed splitmix64 finalizer, 16 bits out. Four
// rounds over the two 16-bit halves give a keyed permutation of 32 bits.
uint32_t MrTable::round_fn(int round, uint32_t half) const noexcept {
  uint64_t z = secret_[round] + half * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 48);
}

uint32_t MrTable::mix(uint32_t plain) const noexcept {
  uint32_t l = plain >> 16, r = plain & 0xffff;
  for (int i = 0; i < kRounds; ++i) {
    const uint32_t next = l ^ round_fn(i, r);
    l = r;
    r = next;
  }
  return (l << 16) | r;
}

uint32_t MrTable::unmix(uint32_t key) const noexcept {
  uint32_t l = key >> 16, r = key & 0xffff;
  for (int i = kRounds - 1; i >= 0; --i) {
    const uint32_t prev = r ^ round_fn(i, l);
    r = l;
    l = prev;
  }
  return (l << 16) | r;
}

uint32_t MrTable::make_key(uint32_t slot) {
  // A fresh random tag per registration: a stale key of a reused slot fails.
  for (;;) {
    const uint32_t key = mix((static_cast<uint32_t>(random64()) & 0xffff0000u) | slot);
    if (key != 0) return key;  // 0 marks a free slot
  }
}

MrEntry* MrTable::add(uint64_t addr, uint64_t length, uint32_t access) {
  std::lock_guard lock(mu_);
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (next_ < kSlots) {
    slot = next_++;
  } else {
    throw Error("register_memory", "tcp", "", ENOSPC, "region table is full (65535)");
  }
  MrEntry& e = slots_[slot];
  e.addr = addr;
  e.length = length;
  e.access = access;
  e.lkey.store(make_key(slot), std::memory_order_relaxed);
  e.rkey.store(make_key(slot), std::memory_order_release);
  return &e;
}

void MrTable::remove(MrEntry* e) noexcept {
  if (e == nullptr) return;
  e->lkey.store(0, std::memory_order_seq_cst);
  e->rkey.store(0, std::memory_order_seq_cst);
  // Dekker with acquire(): either it sees rkey == 0 or we see its pin. The
  // wait is bounded by one payload transfer, or the peer timeout at worst.
  for (int i = 0; e->users.load(std::memory_order_seq_cst) != 0; ++i) {
    if (i < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::lock_guard lock(mu_);
  free_.push_back(static_cast<uint32_t>(e - slots_.get()));
}

namespace {
bool range_ok(uint64_t base, uint64_t size, uint64_t addr, uint64_t len) noexcept {
  // Overflow-safe: addr >= base && addr + len <= base + size.
  return addr >= base && len <= size && addr - base <= size - len;
}
}  // namespace

MrEntry* MrTable::acquire(uint32_t rkey, uint64_t addr, uint64_t len,
                          uint32_t need) noexcept {
  if (rkey == 0) return nullptr;
  MrEntry& e = slots_[slot_of(rkey)];
  e.users.fetch_add(1, std::memory_order_seq_cst);
  if (e.rkey.load(std::memory_order_seq_cst) != rkey || (e.access & need) != need ||
      !range_ok(e.addr, e.length, addr, len)) {
    e.users.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  return &e;
}

bool MrTable::check_local(uint32_t lkey, const void* addr, uint64_t len,
                          uint32_t need) const noexcept {
  if (lkey == 0) return false;
  const MrEntry& e = slots_[slot_of(lkey)];
  return e.lkey.load(std::memory_order_acquire) == lkey && (e.access & need) == need &&
         range_ok(e.addr, e.length, reinterpret_cast<uint64_t>(addr), len);
}

// ---------------------------------------------------------------- Engine

Engine::Engine(bool progress_thread)
    : qp_num_((static_cast<uint32_t>(std::random_device{}()) & 0xffffu) | 0x10000u),
      with_thread_(progress_thread) {
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
  if (with_thread_) thread_ = std::thread([this] { run(); });
  core::log().debug("tcp: engine up ({} progress thread)",
                    with_thread_ ? "with" : "without");
}

Engine::~Engine() {
  stop_.store(true);
  kick();
  if (thread_.joinable()) thread_.join();
  epoll_fd_.reset();
  wake_fd_.reset();
}

void Engine::kick() noexcept {
  const uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_.get(), &one, sizeof one);
}

void Engine::add_qp(TcpQp* qp) {
  std::lock_guard lock(mu_);
  qps_.push_back(qp);
  if (qp->socket_fd() >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u64 = qp->qp_num();
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, qp->socket_fd(), &ev) == 0) {
      qp->ep_armed = true;
    }
  }
}

void Engine::remove_qp(TcpQp* qp) noexcept {
  // Taking mu_ also waits for the thread to finish serving this QP.
  std::lock_guard lock(mu_);
  if (qp->socket_fd() >= 0)
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, qp->socket_fd(), nullptr);
  std::erase(qps_, qp);
}

void Engine::run() noexcept {
  epoll_event events[64];
  int timeout_ms = 5;
  while (!stop_.load(std::memory_order_relaxed)) {
    const int n = ::epoll_wait(epoll_fd_.get(), events, 64, timeout_ms);
    std::lock_guard lock(mu_);
    const int64_t now = now_ns();
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
          qp->ep_armed = false;
          qp->ep_event = true;
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

// ---------------------------------------------------------------- CQ

TcpCq::TcpCq(std::shared_ptr<Engine> engine, const CqOptions& options)
    : CompletionQueue(options),
      engine_(std::move(engine)),
      ring_(std::max<uint32_t>(options.capacity, 1)) {
  budget_ = core::CqBudget(ring_.size());
  event_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event_fd_.get()) throw Error("create_cq", "tcp", "", errno, "eventfd");
}

TcpCq::~TcpCq() {
  std::lock_guard lock(attach_mu_);
  if (!qps_.empty()) {
    core::log().error("tcp: completion queue destroyed before {} queue pair(s)",
                      qps_.size());
  }
  event_fd_.reset();
}

bool TcpCq::has_room(uint32_t depth, uint32_t srq_depth, TcpSrq* srq) noexcept {
  std::lock_guard lock(attach_mu_);
  uint64_t need = uint64_t{depth} + srq_depth;
  for (const auto& entry : srqs_) {
    if (srq != nullptr && entry.first == srq) need -= srq_depth;  // counted once per SRQ
  }
  return budget_.committed() + orphans_.load(std::memory_order_relaxed) + need <=
         budget_.capacity();
}

void TcpCq::reserve(uint32_t depth, TcpSrq* srq, const char* op,
                    const std::string& peer) {
  std::lock_guard lock(attach_mu_);
  if (srq != nullptr) {
    for (auto& [s, n] : srqs_) {
      if (s == srq) {
        ++n;
        return;
      }
    }
  }
  // A destroyed QP's unpolled completions still occupy the ring.
  const uint64_t orphans = orphans_.load(std::memory_order_relaxed);
  budget_.charge(depth, op, "tcp", peer, orphans);
  if (srq != nullptr) srqs_.emplace_back(srq, 1);
}

void TcpCq::unreserve(uint32_t depth, TcpSrq* srq) noexcept {
  std::lock_guard lock(attach_mu_);
  if (srq != nullptr) {
    auto it = std::find_if(srqs_.begin(), srqs_.end(),
                           [&](const auto& e) { return e.first == srq; });
    if (it == srqs_.end() || --it->second != 0) return;
    srqs_.erase(it);
  }
  budget_.refund(depth);
}

void TcpCq::attach(TcpQp* qp) {
  std::lock_guard lock(attach_mu_);
  qps_.push_back(qp);
}

void TcpCq::detach(TcpQp* qp) noexcept {
  // poll() drives its QPs with attach_mu_ held: once we have it, no poll of
  // this CQ is inside qp and none will enter it.
  std::lock_guard lock(attach_mu_);
  std::erase(qps_, qp);
}

void TcpCq::orphan(TcpQp* qp) noexcept {
  // Completions of a destroyed QP stay pollable, minus slot accounting. The
  // SRQ may be destroyed before they are polled, so its slots are returned
  // now; the CQ room they take stays charged (orphans_) until polled, so a
  // new QP cannot be admitted into it.
  ring_lock_.lock();
  uint64_t n = 0;
  for (uint64_t i = head_; i != tail_; ++i) {
    CqEntry& e = ring_[i % ring_.size()];
    if (e.retire_qp != qp) continue;
    if (e.retire == Retire::kSrq && qp->srq() != nullptr) qp->srq()->retire_one();
    e.retire_qp = nullptr;
    e.retire = Retire::kOrphan;
    ++n;
  }
  orphans_.fetch_add(n, std::memory_order_relaxed);
  ring_lock_.unlock();
}

void TcpCq::push(const CqEntry& entry) noexcept {
  ring_lock_.lock();
  if (tail_ - head_ >= ring_.size()) {
    // Unreachable: reserve() keeps the attached depths within capacity and
    // every completion holds a queue slot until it is polled. Kept as a loud
    // check rather than a silent overwrite.
    if (overflows_++ == 0) {
      core::log().critical("tcp: completion queue overrun (capacity {}): internal error",
                           ring_.size());
    }
    ring_lock_.unlock();
    return;
  }
  ring_[tail_++ % ring_.size()] = entry;
  ring_lock_.unlock();
  if (armed_.exchange(false, std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(event_fd_.get(), &one, sizeof one);
  }
}

int TcpCq::poll(std::span<Completion> out) noexcept {
  const int64_t now = now_ns();
  last_poll_ns_.store(now, std::memory_order_relaxed);
  // The poller drives its queue pairs' sockets itself: no thread hop on the
  // latency path. try_lock: QP creation/destruction never blocks a poll.
  if (attach_mu_.try_lock()) {
    for (TcpQp* qp : qps_) qp->try_progress(now);
    attach_mu_.unlock();
  }
  int n = 0;
  ring_lock_.lock();
  while (n < static_cast<int>(out.size()) && head_ != tail_) {
    CqEntry& e = ring_[head_++ % ring_.size()];
    out[n++] = e.c;
    // verbs slot rule: a queue slot is free once its completion is polled.
    if (e.retire == Retire::kOrphan) {
      orphans_.fetch_sub(1, std::memory_order_relaxed);
    } else if (e.retire_qp != nullptr) {
      switch (e.retire) {
        case Retire::kSend: e.retire_qp->retire_to(e.retire_seq + 1); break;
        case Retire::kRecv: e.retire_qp->retire_recv(); break;
        case Retire::kSrq: e.retire_qp->srq()->retire_one(); break;
        case Retire::kNone:
        case Retire::kOrphan: break;
      }
    }
  }
  ring_lock_.unlock();
  return n;
}

bool TcpCq::arm() noexcept {
  uint64_t drained;
  [[maybe_unused]] auto r = ::read(event_fd_.get(), &drained, sizeof drained);
  armed_.store(true, std::memory_order_seq_cst);
  ring_lock_.lock();
  const bool pending = head_ != tail_;
  ring_lock_.unlock();
  if (pending) {
    armed_.store(false, std::memory_order_seq_cst);
    return false;
  }
  // From now on the progress thread serves our QPs (driving() is false). If
  // it stood back from one while we were polling, its epoll registration is
  // spent: wake it now rather than at its next tick.
  bool deferred = false;
  if (attach_mu_.try_lock()) {
    for (TcpQp* qp : qps_) deferred |= qp->wants_service();
    attach_mu_.unlock();
  } else {
    deferred = true;
  }
  if (deferred) engine_->kick();
  return true;
}

// ---------------------------------------------------------------- SRQ

TcpSrq::TcpSrq(std::shared_ptr<Engine> engine, const SrqOptions& options)
    : SharedReceiveQueue(options), engine_(std::move(engine)), ring_(options.max_wr) {}

TcpSrq::~TcpSrq() {
  std::lock_guard lock(attach_mu_);
  if (!qps_.empty()) {
    core::log().error("tcp: shared receive queue destroyed before {} queue pair(s)",
                      qps_.size());
  }
}

void TcpSrq::attach(TcpQp* qp) {
  std::lock_guard lock(attach_mu_);
  qps_.push_back(qp);
}

void TcpSrq::detach(TcpQp* qp) noexcept {
  std::lock_guard lock(attach_mu_);
  std::erase(qps_, qp);
}

bool TcpSrq::claim(RecvWr* out) noexcept {
  lock_.lock();
  const bool any = head_ != tail_;
  if (any) *out = ring_[head_++ % ring_.size()];
  lock_.unlock();
  return any;
}

PostResult TcpSrq::do_post_recv(std::span<const RecvWr> wrs) noexcept {
  PostResult result;
  lock_.lock();
  for (const RecvWr& wr : wrs) {
    // A slot is free once the completion of the RECV it held was polled.
    if (tail_ - retired_.load(std::memory_order_acquire) >= ring_.size()) {
      result.status = PostStatus::kQueueFull;
      break;
    }
    ring_[tail_++ % ring_.size()] = wr;
    ++result.posted;
  }
  lock_.unlock();
  if (result.posted == 0) return result;
  // A SEND may be RNR-stalled on some QP waiting for exactly this buffer:
  // drive it now if nobody else is, and wake the progress thread in case.
  bool kick = false;
  if (attach_mu_.try_lock()) {
    const int64_t now = now_ns();
    for (TcpQp* qp : qps_) {
      if (qp->rnr_stalled() && !qp->try_progress(now)) kick = true;
    }
    attach_mu_.unlock();
  } else {
    kick = true;
  }
  if (kick) engine_->kick();
  return result;
}

}  // namespace rdmakit::tcp
