// The engine: one context, one shared completion queue, one progress thread,
// and the protocol of every stream on it (see wire.hpp, docs/streams.md).
#include "stream/engine.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace rdmakit::stream::detail {

namespace {
constexpr uint32_t kMaxChunk = 1u << 20;  // one WRITE; < 2^22 (imm) and < 2^21 (wr_id)
constexpr uint32_t kDataReserve = 3;      // credits kept for CREDIT, FIN, RST
constexpr uint32_t kCreditReserve = 2;    // credits kept for FIN/RST
// Receives re-posted together: at most 1/8 of the credits wait (so the
// peer keeps its reserves), at most kMaxRepostBatch per post.
constexpr uint32_t kMaxRepostBatch = 16;
}  // namespace

size_t StreamCore::memory_bytes() const noexcept {
  // Buffers plus the queue slots the provider keeps per QP (send: request +
  // inline copy; receive: one entry each), as configured.
  return static_cast<size_t>(opt.rx_ring) + opt.tx_buffer +
         static_cast<size_t>(opt.recv_credits) * wire::kRecordStride +
         static_cast<size_t>(send_depth) * (sizeof(SendWr) + opt.max_inline) +
         static_cast<size_t>(opt.recv_credits) * sizeof(RecvWr) + sizeof(StreamCore);
}

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
  slots.resize(options.max_streams);
  slot_gen.assign(options.max_streams, 0);
  free_slots.reserve(options.max_streams);
  for (uint32_t i = options.max_streams; i > 0; --i) free_slots.push_back(i - 1);
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
    while (live > 0 && Clock::now() < deadline) {
      lock.unlock();
      ::usleep(1000);
      lock.lock();
    }
    stop_ = true;
  }
  kick();
  thread_.join();
  slots.clear();  // QPs and regions before the CQ and the context
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
  auto core = std::make_shared<StreamCore>(*this, o);
  core->rx = ctx->allocate(o.rx_ring, kAccessLocalWrite | kAccessRemoteWrite);
  core->tx = ctx->allocate(o.tx_buffer, kAccessLocalWrite);
  // Plain heap memory: only this side writes it (a provider copies a
  // record's bytes in at its completion), so it needs no shared mapping.
  const size_t rec_bytes = static_cast<size_t>(o.recv_credits) * wire::kRecordStride;
  core->rec_buf = std::make_unique<std::byte[]>(rec_bytes);
  core->rec_mr = ctx->register_memory(core->rec_buf.get(), rec_bytes, kAccessLocalWrite);
  core->flow.rx_size = o.rx_ring;
  core->send_depth = 2 * o.recv_credits + 8;
  return core;
}

void EngineImpl::start(const std::shared_ptr<StreamCore>& core,
                       std::unique_ptr<QueuePair> qp, const wire::Hello& peer) {
  std::unique_lock lock(mu);
  if (free_slots.empty()) {
    lock.unlock();
    qp.reset();
    throw Error("stream start", ctx->provider_name(), core->peer, EMFILE,
                "engine already holds max_streams=" +
                    std::to_string(options.max_streams) + " streams");
  }
  StreamCore& s = *core;
  s.slot = free_slots.back();
  free_slots.pop_back();
  s.gen = ++slot_gen[s.slot];
  s.peer = qp->peer();
  s.qp = std::move(qp);
  s.peer_ring = peer.ring;
  s.flow.peer_ring = static_cast<uint32_t>(peer.ring.length);
  s.flow.peer_credits = peer.recv_credits;
  s.flow.msg_credits = peer.recv_credits;
  s.flow.peer_rewinds = (peer.features & wire::Hello::kFeatureRewind) != 0;
  s.last_rx = s.last_tx = Clock::now();
  s.send_depth = s.qp->options().max_send_wr;
  s.repost_batch = std::clamp<uint32_t>(s.opt.recv_credits / 8, 1, kMaxRepostBatch);
  std::vector<RecvWr> recvs(s.opt.recv_credits);
  for (uint32_t i = 0; i < s.opt.recv_credits; ++i) recvs[i] = s.record_recv(i);
  s.recv_posted = s.opt.recv_credits;
  const PostResult r = s.qp->post_recv(recvs);
  slots[s.slot] = core;
  ++live;
  s.published.store(s.events(), std::memory_order_release);
  if (!r.ok()) fail(s, ECONNRESET, Status::kGeneralError);
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
  s.defer_readable = (reads_next || s.lazy_readiness) && !about_to_sleep;
  drain();
  update(s);
  s.defer_readable = s.lazy_readiness;
  const short ev = s.events();
  if (about_to_sleep) before_would_block();
  return ev;
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
  const uint64_t slot = c.wr_id >> 40;
  const auto gen = static_cast<uint8_t>(c.wr_id >> 32);
  if (slot >= slots.size() || !slots[slot] || slots[slot]->gen != gen) return;
  // Only a closed stream can be finalized (dropped from its slot) below: hold
  // a reference then, and spare the atomic count on every other completion.
  std::shared_ptr<StreamCore> keep;
  if (slots[slot]->closed) keep = slots[slot];
  StreamCore& s = *slots[slot];
  const uint64_t kind = (c.wr_id >> 28) & 0xF;
  if (kind == kWrSend) {
    s.sends_outstanding -= std::min(s.sends_outstanding, wr_count(c.wr_id));
    if (!c.ok()) {
      fail(s, ECONNRESET, c.status);
    } else {
      s.tx_freed += wr_bytes(c.wr_id);
    }
  } else if (kind == kWrRecv) {
    if (c.status == Status::kLocalLengthError && s.err == 0) {
      // A SEND larger than the record buffers: no honest peer sends one.
      std::fprintf(stderr,
                   "rdmakit stream: protocol violation from %s (%s): a record larger "
                   "than %u bytes (%s); stream reset\n",
                   s.peer.c_str(), ctx->provider_name(), wire::kRecordData,
                   status_name(c.status));
      fail(s, EPROTO, c.status);
    } else if (!c.ok()) {
      // After the peer's FIN its QP may go away: that is its close, not an error.
      if (!s.flow.fin_received) fail(s, ECONNRESET, c.status);
    } else {
      on_recv(s, c);
    }
  }
  pump(s);
  update(s);
  maybe_finalize(s);
}

void EngineImpl::on_recv(StreamCore& s, const Completion& c) noexcept {
  // A send may fail (the peer closed and left) while its last data and FIN
  // still wait in our completion queue: those are still delivered. Only a
  // peer that broke the protocol is not listened to any more.
  if (s.err == EPROTO) return;
  ++s.rx_msgs;  // the timers turn counts into times: no clock read per message
  const bool record = c.opcode == Opcode::kRecv;
  if (!c.has_imm() || (!record && c.opcode != Opcode::kRecvWriteWithImm) ||
      s.flow.on_message(c.imm, c.byte_len, record) != wire::Flow::Result::kOk) {
    std::fprintf(
        stderr,
        "rdmakit stream: protocol violation from %s (%s): %s imm 0x%08x byte_len %u; "
        "stream reset\n",
        s.peer.c_str(), ctx->provider_name(), record ? "record" : "ring write", c.imm,
        c.byte_len);
    fail(s, EPROTO, Status::kSuccess);
    return;
  }
  if (record) {
    // The buffer index is our own (wr_id); on_message bounded the length.
    const uint32_t idx = wr_bytes(c.wr_id) % s.opt.recv_credits;
    // on_message advanced rx_written past this record (after a rewind, if any).
    const uint64_t at = s.flow.rx_written - c.byte_len;
    wire::place_record(s.rx->data(), s.flow.rx_size, at,
                       s.rec_buf.get() + static_cast<size_t>(idx) * wire::kRecordStride,
                       c.byte_len);
  }
  // Re-posted only now: the buffer of this receive was read above.
  if (++s.repost_pending >= s.repost_batch && !flush_reposts(s)) return;
  if (s.flow.rst_received) fail(s, ECONNRESET, Status::kSuccess);
  if (s.rd_shut) s.flow.rx_read = s.flow.rx_written;  // discarded, credited back
}

bool EngineImpl::flush_reposts(StreamCore& s) noexcept {
  if (s.repost_pending == 0 || !s.qp) return true;
  std::array<RecvWr, kMaxRepostBatch> again;
  const uint32_t n = std::min(s.repost_pending, kMaxRepostBatch);
  for (uint32_t i = 0; i < n; ++i)
    again[i] =
        s.record_recv(static_cast<uint32_t>((s.recv_posted + i) % s.opt.recv_credits));
  const PostResult r = s.qp->post_recv(std::span<const RecvWr>(again.data(), n));
  if (!r.ok() || r.posted != n) {
    fail(s, ECONNRESET, Status::kGeneralError);
    return false;
  }
  s.recv_posted += n;
  s.repost_pending -= n;
  s.flow.rx_unreported += n;
  return true;
}

bool EngineImpl::post_message(StreamCore& s, uint32_t imm) noexcept {
  if (s.sends_outstanding >= s.send_depth || s.flow.msg_credits == 0) return false;
  SendWr wr;
  wr.wr_id = make_wr_id(s.slot, s.gen, kWrSend, 0, s.unsignaled + 1);
  wr.opcode = Opcode::kWriteWithImm;
  wr.flags = kSignaled;
  wr.length = 0;
  wr.imm = imm;
  wr.remote_addr = s.peer_ring.addr;
  wr.rkey = s.peer_ring.rkey;
  if (!s.qp->post_send(wr).ok()) return false;
  s.unsignaled = 0;
  --s.flow.msg_credits;
  ++s.sends_outstanding;
  ++s.tx_msgs;
  return true;
}

void EngineImpl::pump(StreamCore& s) noexcept {
  if (s.rst_pending) {  // an abort waits for a message credit, nothing else goes
    send_rst(s);
    return;
  }
  if (s.err != 0 || !s.qp) return;
  bool sent = false;
  while (s.tx_posted < s.tx_staged && s.flow.msg_credits >= kDataReserve &&
         s.sends_outstanding < s.send_depth) {
    const uint64_t room = s.flow.peer_room();
    if (room == 0) break;
    const uint64_t toff = s.tx_posted % s.opt.tx_buffer;
    const uint32_t rewind = s.flow.rewind_due();
    const uint64_t poff = rewind != 0 ? 0 : s.flow.tx_sent % s.flow.peer_ring;
    const auto n = static_cast<uint32_t>(
        std::min({s.tx_staged - s.tx_posted, room, s.opt.tx_buffer - toff,
                  s.flow.peer_ring - poff, static_cast<uint64_t>(kMaxChunk)}));
    SendWr wr;
    wr.wr_id = make_wr_id(s.slot, s.gen, kWrSend, n, s.unsignaled + 1);
    wr.opcode = Opcode::kWriteWithImm;
    wr.flags = kSignaled;
    wr.length = n;
    wr.local_addr = s.tx->data() + toff;
    wr.lkey = s.tx->lkey();
    wr.imm = wire::encode(wire::Op::kData, s.flow.rx_unreported, n | rewind);
    wr.remote_addr = s.peer_ring.addr + poff;
    wr.rkey = s.peer_ring.rkey;
    const PostResult r = s.qp->post_send(wr);
    if (!r.ok()) {
      if (r.status == PostStatus::kQueueFull) break;
      fail(s, ECONNRESET, Status::kGeneralError);
      return;
    }
    s.flow.take_unreported();
    if (rewind != 0) s.flow.rewind();
    s.unsignaled = 0;
    s.tx_posted += n;
    s.flow.tx_sent += n;
    --s.flow.msg_credits;
    ++s.sends_outstanding;
    sent = true;
  }
  if (sent) ++s.tx_msgs;
  const uint64_t unacked = s.flow.rx_read - s.flow.rx_acked;
  if ((unacked >= s.flow.rx_size / 2 || s.flow.rx_unreported >= s.opt.recv_credits / 2 ||
       s.flow.empty_credit_due()) &&
      s.flow.msg_credits >= kCreditReserve) {
    const uint32_t msgs = s.flow.rx_unreported;
    if (post_message(
            s, wire::encode(wire::Op::kCredit, msgs, static_cast<uint32_t>(unacked)))) {
      s.flow.rx_unreported -= msgs;
      s.flow.rx_acked += unacked;
    }
  }
  if (s.wr_shut && !s.fin_sent && s.tx_posted == s.tx_staged && s.flow.msg_credits >= 1) {
    const uint32_t msgs = s.flow.rx_unreported;
    if (post_message(s, wire::encode(wire::Op::kCtrl, msgs, wire::kFin))) {
      s.flow.rx_unreported -= msgs;
      s.fin_sent = true;
    }
  }
}

void EngineImpl::fail(StreamCore& s, int err, Status status) noexcept {
  if (s.err != 0) return;
  // Tell a live peer (a timeout or a protocol violation leaves our QP up).
  if (err != ECONNRESET && s.qp && s.flow.msg_credits >= 1)
    (void)post_message(s, wire::encode(wire::Op::kCtrl, 0, wire::kRst));
  s.err = err;
  s.err_status = status;
  // Bytes from a peer that broke the protocol are not delivered.
  if (err == EPROTO) s.flow.rx_read = s.flow.rx_written;
  update(s);
}

void EngineImpl::update(StreamCore& s) noexcept {
  // Published before the fd changes: a thread the fd wakes (the preload's
  // hooks answer from last_events() without the lock) must find the new
  // state there. Storing it after the fd's system calls made such readers
  // see data the fd had announced as absent (EAGAIN in preload_epoll_*).
  s.published.store(s.events(), std::memory_order_release);
  if (s.readiness.is_open()) {
    bool readable = s.readable();
    // Data found by a caller that takes it next: signalling it would cost
    // a send now and a recv when the read empties the ring, for a state no
    // one else needs to see (a sleeper on the fd would find the data gone;
    // if some is left, the read's own update signals it). Only data is
    // deferred: end of stream and errors are signalled at once.
    const bool defer = s.defer_readable && readable && !s.readiness.readable() &&
                       s.flow.available() > 0 && s.err == 0 && !s.flow.fin_received &&
                       !s.rd_shut;
    s.readiness_stale = defer;
    if (defer) readable = false;
    s.show_ended();
    s.readiness.set(readable, s.writable());
  }
  if (s.waiters > 0) s.cv.notify_all();
}

void EngineImpl::close(StreamCore& s) noexcept {
  s.closed = true;
  s.wr_shut = true;
  s.rd_shut = true;
  s.flow.rx_read = s.flow.rx_written;
  s.linger_deadline = Clock::now() + s.opt.linger;
  s.readiness.close();
  pump(s);
  if (s.waiters > 0) s.cv.notify_all();
  maybe_finalize(s);
}

void EngineImpl::abort(StreamCore& s) noexcept {
  s.closed = true;
  s.aborted = true;
  s.wr_shut = true;
  s.rd_shut = true;
  s.flow.rx_read = s.flow.rx_written;  // unread bytes dropped
  s.tx_staged = s.tx_posted;           // unsent bytes dropped (posted ones are out)
  s.linger_deadline = Clock::now() + s.opt.linger;
  s.readiness.close();
  send_rst(s);
  if (s.waiters > 0) s.cv.notify_all();
  maybe_finalize(s);
}

void EngineImpl::send_rst(StreamCore& s) noexcept {
  s.rst_pending = false;
  // A stream that already failed needs no RST: the peer reset it, is gone, or
  // was told by fail().
  if (s.err != 0 || !s.qp) return;
  if (!post_message(s, wire::encode(wire::Op::kCtrl, 0, wire::kRst))) {
    s.rst_pending = true;  // no credit or send slot: pump() retries
    return;
  }
  s.err = ECONNRESET;
  s.err_status = Status::kSuccess;
}

void EngineImpl::maybe_finalize(StreamCore& s) noexcept {
  if (!s.closed) return;
  const bool drained =
      s.fin_sent && s.tx_freed == s.tx_staged && s.sends_outstanding == 0;
  if (s.err == 0 && !drained) return;
  // An abort's RST (and the data posted before it) must leave before the QP.
  if (s.aborted && s.sends_outstanding > 0 && Clock::now() < s.linger_deadline) return;
  const uint32_t slot = s.slot;
  if (slots[slot].get() != &s) return;
  free_slots.push_back(slot);
  --live;
  slots[slot].reset();  // destroys the QP, then the regions
}

void EngineImpl::timers(Clock::time_point now) noexcept {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i]) continue;
    const std::shared_ptr<StreamCore> keep = slots[i];
    StreamCore& s = *keep;
    if (s.rx_msgs != s.rx_seen) {
      s.rx_seen = s.rx_msgs;
      s.last_rx = now;
    }
    if (s.tx_msgs != s.tx_seen) {
      s.tx_seen = s.tx_msgs;
      s.last_tx = now;
    }
    // Receives a batch left waiting: an idle stream gives them back here.
    if (s.err == 0 && s.repost_pending > 0) (void)flush_reposts(s);
    // A deferred readable signal whose read never came (a zero-length
    // read): the fd shows the data from here on.
    if (s.readiness_stale) update(s);
    if (s.err == 0) {
      if (s.closed && now >= s.linger_deadline) {
        fail(s, ETIMEDOUT, Status::kSuccess);
      } else if (now - s.last_rx >= s.opt.peer_timeout) {
        std::fprintf(
            stderr, "rdmakit stream: peer %s (%s) silent for %lld ms: ETIMEDOUT\n",
            s.peer.c_str(), ctx->provider_name(),
            static_cast<long long>(
                std::chrono::duration_cast<std::chrono::milliseconds>(now - s.last_rx)
                    .count()));
        fail(s, ETIMEDOUT, Status::kSuccess);
      } else if (now - s.last_tx >= s.opt.keepalive &&
                 s.flow.msg_credits >= kCreditReserve) {
        const uint32_t msgs = s.flow.rx_unreported;
        if (post_message(s, wire::encode(wire::Op::kCtrl, msgs, wire::kKeepalive)))
          s.flow.rx_unreported -= msgs;
      }
    }
    pump(s);
    maybe_finalize(s);
  }
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
