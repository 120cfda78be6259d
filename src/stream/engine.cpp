// The engine: one context, one shared completion queue, one progress thread,
// and the protocol of every stream on it (see wire.hpp, docs/streams.md).
#include "stream/engine.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <span>

namespace rdmakit::stream::detail {

void EngineImpl::validate(const StreamOptions& o) {
  auto bad = [](const std::string& what) {
    throw Error("stream options", "stream", "", EINVAL, what);
  };
  if (o.rx_ring < wire::kMinRing || o.rx_ring > wire::kMaxRing)
    bad("rx_ring must be 4 KiB .. 2 MiB, got " + std::to_string(o.rx_ring));
  if (o.tx_buffer < 1024 || o.tx_buffer > (64u << 20))
    bad("tx_buffer must be 1 KiB .. 64 MiB, got " + std::to_string(o.tx_buffer));
  if (o.recv_credits < wire::kMinCredits || o.recv_credits > wire::kMaxCredits)
    bad("recv_credits must be 8 .. 255, got " + std::to_string(o.recv_credits));
  if (o.keepalive.count() <= 0 || o.peer_timeout <= o.keepalive)
    bad("keepalive must be > 0 and below peer_timeout");
}

EngineImpl::EngineImpl(const EngineOptions& opts) : options(opts) {
  validate(options.stream);
  if (options.max_streams == 0 || options.max_streams > (1u << 20))
    throw Error("stream engine", "stream", "", EINVAL, "max_streams must be 1 .. 2^20");
  ContextOptions copts;
  copts.provider = options.provider;
  copts.shm = options.shm;
  ctx = Context::open(copts);
  const uint64_t per_stream = 3ull * options.stream.recv_credits + 8;
  CqOptions cqo;
  cqo.capacity =
      static_cast<uint32_t>(std::max<uint64_t>(4096, per_stream * options.max_streams));
  cqo.spin = std::chrono::nanoseconds(0);
  const uint32_t wanted = cqo.capacity;
  std::string refusal;
  for (;;) {
    try {
      cq = ctx->create_cq(cqo);
      break;
    } catch (const Error& e) {
      // A device's CQ size limit (rxe: 32767): a smaller shared CQ admits
      // fewer streams (connect/accept then fail with the core's error).
      if (e.sys_errno() != EINVAL || cqo.capacity <= 4096) throw;
      if (refusal.empty()) refusal = e.what();
      cqo.capacity = std::max<uint32_t>(4096, cqo.capacity / 2);
    }
  }
  static std::atomic<bool> said{false};
  if (!refusal.empty() && !said.exchange(true)) {
    std::fprintf(
        stderr,
        "rdmakit stream: a shared completion queue of %u entries was refused (%s); "
        "using %u entries: about %llu streams of %u credits per engine (said once "
        "per process)\n",
        wanted, refusal.c_str(), cqo.capacity,
        static_cast<unsigned long long>(cqo.capacity / per_stream),
        options.stream.recv_credits);
  }
  slots_.resize(options.max_streams);
  slot_gen_.assign(options.max_streams, 0);
  free_slots_.reserve(options.max_streams);
  for (uint32_t i = options.max_streams; i > 0; --i) free_slots_.push_back(i - 1);
  kick_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (kick_fd_ < 0)
    throw Error("stream engine", ctx->provider_name(), "", errno, "eventfd");
  tick_ = std::clamp(options.stream.keepalive / 4, std::chrono::milliseconds(5),
                     std::chrono::milliseconds(100));
  thread_ = std::thread([this] {
    if (options.on_thread_start != nullptr) options.on_thread_start();
    progress_loop();
  });
}

EngineImpl::~EngineImpl() {
  // Closed streams still delivering queued data: give them their linger.
  const auto deadline = Clock::now() + options.stream.linger;
  {
    std::unique_lock lock(mu);
    while (live_ > 0 && Clock::now() < deadline) {
      lock.unlock();
      ::usleep(1000);
      lock.lock();
    }
    stop_ = true;
  }
  kick();
  thread_.join();
  slots_.clear();  // QPs and regions before the CQ and the context
  cq.reset();
  ctx.reset();
  if (kick_fd_ >= 0) ::close(kick_fd_);
}

QpOptions EngineImpl::qp_options(const StreamOptions& o) const {
  QpOptions q;
  q.send_cq = cq.get();
  q.recv_cq = cq.get();
  q.max_send_wr = 2 * o.recv_credits + 8;
  q.max_recv_wr = o.recv_credits;
  q.max_inline = o.max_inline;
  q.rnr_timeout = std::max<std::chrono::milliseconds>(o.connect_timeout,
                                                      std::chrono::milliseconds(1000));
  q.peer_timeout = o.peer_timeout;
  // Application threads and the progress thread post, always under the
  // engine's lock, which also covers every poll and arm of the CQ: the QP
  // needs no post lock of its own (nor the CQ a multi-producer ring), which
  // took about 5 ns of a 16 B ping-pong's ~100 ns per message (path cost).
  q.caller_serializes = true;
  return q;
}

std::shared_ptr<StreamCore> EngineImpl::make_core(const StreamOptions& o) {
  validate(o);
  return std::make_shared<StreamCore>(*this, *ctx, o);
}

void EngineImpl::start(const std::shared_ptr<StreamCore>& core,
                       std::unique_ptr<QueuePair> qp, const wire::Hello& peer) {
  std::unique_lock lock(mu);
  if (free_slots_.empty()) {
    lock.unlock();
    qp.reset();
    throw Error("stream start", ctx->provider_name(), core->peer(), EMFILE,
                "engine already holds max_streams=" +
                    std::to_string(options.max_streams) + " streams");
  }
  StreamCore& s = *core;
  const uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  const bool posted = s.attach(slot, ++slot_gen_[slot], std::move(qp), peer);
  slots_[slot] = core;
  ++live_;
  if (!posted) s.fail(ECONNRESET, Status::kGeneralError);
}

void EngineImpl::close(StreamCore& s) noexcept {
  s.mark_closed();
  pump(s);
  s.wake_waiters();
  maybe_finalize(s);
}

void EngineImpl::abort(StreamCore& s) noexcept {
  s.mark_aborted();
  s.send_rst();
  s.wake_waiters();
  maybe_finalize(s);
}

void EngineImpl::maybe_finalize(StreamCore& s) noexcept {
  if (!s.finished()) return;
  const uint32_t slot = s.slot();
  if (slots_[slot].get() != &s) return;
  free_slots_.push_back(slot);
  --live_;
  slots_[slot].reset();  // destroys the QP, then the regions
}

void EngineImpl::pump(StreamCore& s) noexcept {
  if (s.rst_pending()) {  // an abort waits for a message credit, nothing else goes
    s.send_rst();
    return;
  }
  if (s.error() != 0 || !s.has_qp()) return;
  while (s.send_queued() && s.can_post_data()) {
    const StreamCore::DataTarget at = s.data_target();
    if (at.room == 0) break;
    const PostResult r =
        s.post_data(at, StreamCore::DataKind::kBuffered, nullptr, s.buffered_chunk(at));
    if (!r.ok()) {
      if (r.status == PostStatus::kQueueFull) break;
      s.fail(ECONNRESET, Status::kGeneralError);
      return;
    }
  }
  if (s.credit_due()) (void)s.send_credit();
  if (s.fin_due()) (void)s.send_fin();
}

bool StreamCore::post_control(uint32_t imm) noexcept {
  if (sends_outstanding_ >= send_depth_ || flow_.msg_credits == 0) return false;
  SendWr wr;
  wr.wr_id = make_wr_id(slot_, gen_, kWrSend, 0, unsignaled_ + 1);
  wr.opcode = Opcode::kWriteWithImm;
  wr.flags = kSignaled;
  wr.length = 0;
  wr.imm = imm;
  wr.remote_addr = peer_ring_.addr;
  wr.rkey = peer_ring_.rkey;
  if (!qp_->post_send(wr).ok()) return false;
  unsignaled_ = 0;
  --flow_.msg_credits;
  ++sends_outstanding_;
  ++tx_msgs_;
  return true;
}

bool StreamCore::credit_due() const noexcept {
  // Half the ring read or half the message credits to report, or an empty
  // ring the writer should learn of so that it rewinds.
  const uint64_t unacked = flow_.rx_read - flow_.rx_acked;
  return (unacked >= flow_.rx_size / 2 || flow_.rx_unreported >= opt.recv_credits / 2 ||
          flow_.empty_credit_due()) &&
         flow_.msg_credits >= wire::kCreditReserve;
}

bool StreamCore::send_credit() noexcept {
  const uint64_t unacked = flow_.rx_read - flow_.rx_acked;
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(
          wire::encode(wire::Op::kCredit, msgs, static_cast<uint32_t>(unacked))))
    return false;
  flow_.rx_unreported -= msgs;
  flow_.rx_acked += unacked;
  return true;
}

bool StreamCore::send_fin() noexcept {
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(wire::encode(wire::Op::kCtrl, msgs, wire::kFin))) return false;
  flow_.rx_unreported -= msgs;
  fin_sent_ = true;
  return true;
}

bool StreamCore::send_keepalive() noexcept {
  const uint32_t msgs = flow_.rx_unreported;
  if (!post_control(wire::encode(wire::Op::kCtrl, msgs, wire::kKeepalive))) return false;
  flow_.rx_unreported -= msgs;
  return true;
}

void StreamCore::send_rst() noexcept {
  rst_pending_ = false;
  // A stream that already failed needs no RST: the peer reset it, is gone, or
  // was told by fail().
  if (err_ != 0 || !qp_) return;
  if (!post_control(wire::encode(wire::Op::kCtrl, 0, wire::kRst))) {
    rst_pending_ = true;  // no credit or send slot: pump() retries
    return;
  }
  err_ = ECONNRESET;
  err_status_ = Status::kSuccess;
}

void EngineImpl::drain() noexcept {
  // batch_ is a member: a local array of Completions would be initialized
  // (2 KiB of stores) on every poll of a spinning reader.
  for (;;) {
    const int n = cq->poll(batch_);
    for (int i = 0; i < n; ++i) dispatch(batch_[static_cast<size_t>(i)]);
    if (n < static_cast<int>(batch_.size())) return;
  }
}

void EngineImpl::dispatch(const Completion& c) noexcept {
  const uint32_t slot = wr_slot(c.wr_id);
  if (slot >= slots_.size() || !slots_[slot] || slots_[slot]->gen() != wr_gen(c.wr_id))
    return;
  // Only a closed stream can be finalized (dropped from its slot) below: hold
  // a reference then, and spare the atomic count on every other completion.
  std::shared_ptr<StreamCore> keep;
  if (slots_[slot]->closed()) keep = slots_[slot];
  StreamCore& s = *slots_[slot];
  const uint64_t kind = wr_kind(c.wr_id);
  if (kind == kWrSend) {
    s.retire_sends(c.wr_id, c.ok());
    if (!c.ok()) s.fail(ECONNRESET, c.status);
  } else if (kind == kWrRecv) {
    if (c.status == Status::kLocalLengthError && s.error() == 0) {
      // A SEND larger than the record buffers: no honest peer sends one.
      std::fprintf(stderr,
                   "rdmakit stream: protocol violation from %s (%s): a record larger "
                   "than %u bytes (%s); stream reset\n",
                   s.peer().c_str(), ctx->provider_name(), wire::kRecordData,
                   status_name(c.status));
      s.fail(EPROTO, c.status);
    } else if (!c.ok()) {
      // After the peer's FIN its QP may go away: that is its close, not an error.
      if (!s.fin_received()) s.fail(ECONNRESET, c.status);
    } else {
      on_recv(s, c);
    }
  }
  pump(s);
  s.update();
  maybe_finalize(s);
}

void EngineImpl::on_recv(StreamCore& s, const Completion& c) noexcept {
  // A send may fail (the peer closed and left) while its last data and FIN
  // still wait in our completion queue: those are still delivered. Only a
  // peer that broke the protocol is not listened to any more.
  if (s.error() == EPROTO) return;
  if (s.accept_message(c) != wire::Flow::Result::kOk) {
    std::fprintf(
        stderr,
        "rdmakit stream: protocol violation from %s (%s): %s imm 0x%08x byte_len %u; "
        "stream reset\n",
        s.peer().c_str(), ctx->provider_name(),
        c.opcode == Opcode::kRecv ? "record" : "ring write", c.imm, c.byte_len);
    s.fail(EPROTO, Status::kSuccess);
    return;
  }
  // Re-posted only now: the buffer of this receive was read above.
  if (s.count_consumed_receive() && !flush_reposts(s)) return;
  if (s.rst_received()) s.fail(ECONNRESET, Status::kSuccess);
  s.discard_if_read_shut();
}

bool EngineImpl::flush_reposts(StreamCore& s) noexcept {
  if (s.repost_receives()) return true;
  s.fail(ECONNRESET, Status::kGeneralError);
  return false;
}

wire::Flow::Result StreamCore::accept_message(const Completion& c) noexcept {
  ++rx_msgs_;  // the timers turn counts into times: no clock read per message
  const bool record = c.opcode == Opcode::kRecv;
  if (!c.has_imm() || (!record && c.opcode != Opcode::kRecvWriteWithImm) ||
      flow_.on_message(c.imm, c.byte_len, record) != wire::Flow::Result::kOk)
    return wire::Flow::Result::kViolation;
  if (record) {
    // The buffer index is our own (wr_id); on_message bounded the length.
    const uint32_t idx = wr_bytes(c.wr_id) % opt.recv_credits;
    // on_message advanced rx_written past this record (after a rewind, if any).
    const uint64_t at = flow_.rx_written - c.byte_len;
    wire::place_record(rx_->data(), flow_.rx_size, at,
                       rec_buf_.get() + static_cast<size_t>(idx) * wire::kRecordStride,
                       c.byte_len);
  }
  return wire::Flow::Result::kOk;
}

bool StreamCore::repost_receives() noexcept {
  if (repost_pending_ == 0 || !qp_) return true;
  std::array<RecvWr, kMaxRepostBatch> again;
  const uint32_t n = std::min(repost_pending_, kMaxRepostBatch);
  for (uint32_t i = 0; i < n; ++i)
    again[i] = record_recv(static_cast<uint32_t>((recv_posted_ + i) % opt.recv_credits));
  const PostResult r = qp_->post_recv(std::span<const RecvWr>(again.data(), n));
  if (!r.ok() || r.posted != n) return false;
  recv_posted_ += n;
  repost_pending_ -= n;
  flow_.rx_unreported += n;
  return true;
}

void EngineImpl::timers(Clock::time_point now) noexcept {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i]) continue;
    const std::shared_ptr<StreamCore> keep = slots_[i];
    StreamCore& s = *keep;
    s.note_traffic(now);
    // Receives a batch left waiting: an idle stream gives them back here.
    if (s.error() == 0 && s.receives_waiting()) (void)flush_reposts(s);
    // A deferred readable signal whose read never came (a zero-length
    // read): the fd shows the data from here on.
    if (s.readiness_stale()) s.update();
    if (s.error() == 0) {
      if (s.linger_expired(now)) {
        s.fail(ETIMEDOUT, Status::kSuccess);
      } else if (s.silent_for(now) >= s.opt.peer_timeout) {
        std::fprintf(
            stderr, "rdmakit stream: peer %s (%s) silent for %lld ms: ETIMEDOUT\n",
            s.peer().c_str(), ctx->provider_name(),
            static_cast<long long>(
                std::chrono::duration_cast<std::chrono::milliseconds>(s.silent_for(now))
                    .count()));
        s.fail(ETIMEDOUT, Status::kSuccess);
      } else if (s.keepalive_due(now)) {
        (void)s.send_keepalive();
      }
    }
    pump(s);
    maybe_finalize(s);
  }
}

void EngineImpl::kick() noexcept {
  const uint64_t one = 1;
  (void)::write(kick_fd_, &one, sizeof one);
}

void EngineImpl::before_would_block() noexcept {
  // An event-loop caller sleeps next: someone must be armed on the CQ.
  sleeper_ = true;
  if (progress_ == Progress::kSleepUnarmed) {
    progress_ = Progress::kRunning;
    kick();
  }
}

short EngineImpl::poll_readiness(StreamCore& s, bool about_to_sleep,
                                 bool reads_next) noexcept {
  // A poll disarms the CQ: a progress thread sleeping armed would no longer
  // be woken by arrivals, so it is sent back to look (as a spinning waiter
  // does). A spinning caller also counts as busy-polling, which keeps the
  // progress thread off the CQ (no wake-up syscall per peer message) while
  // the calls go on.
  if (!about_to_sleep) ++spin_epoch_;
  if (progress_ == Progress::kSleepArmed) {
    progress_ = Progress::kRunning;
    kick();
  }
  s.begin_poll(reads_next, about_to_sleep);
  drain();
  s.update();
  s.end_poll();
  const short ev = s.events();
  if (about_to_sleep) before_would_block();
  return ev;
}

void EngineImpl::progress_loop() noexcept {
  std::unique_lock lock(mu);
  auto next_timers = Clock::now() + tick_;
  uint64_t seen_epoch = spin_epoch_;
  while (!stop_) {
    drain();
    const auto now = Clock::now();
    if (now >= next_timers) {
      timers(now);
      next_timers = now + tick_;
    }
    bool armed = false;
    int timeout_ms;
    if ((spinning_ > 0 || spin_epoch_ != seen_epoch) && !sleeper_) {
      // Application threads poll the CQ themselves: stay off it (arming
      // would make every peer message a wake-up syscall) and look again soon.
      seen_epoch = spin_epoch_;
      progress_ = Progress::kSleepUnarmed;
      timeout_ms = 2;
    } else {
      seen_epoch = spin_epoch_;
      sleeper_ = false;
      if (!cq->arm()) continue;  // completions pending
      armed = true;
      progress_ = Progress::kSleepArmed;
      timeout_ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next_timers - now)
              .count() +
          1);
    }
    lock.unlock();
    pollfd fds[2] = {{kick_fd_, POLLIN, 0}, {cq->fd(), POLLIN, 0}};
    (void)::poll(fds, armed ? 2 : 1, timeout_ms);
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t v;
      (void)::read(kick_fd_, &v, sizeof v);
    }
    lock.lock();
    progress_ = Progress::kRunning;
  }
}

}  // namespace rdmakit::stream::detail
