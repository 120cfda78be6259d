// The engine's lifetime and its streams': the shared context, CQ and
// progress thread; a stream's options, buffers, slot and start; its close,
// abort and the freeing of its slot.
#include "stream/engine.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "rdmakit/detail/library_thread.hpp"

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
  thread_ = rdmakit::detail::start_library_thread([this] {
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

}  // namespace rdmakit::stream::detail
