#pragma once
// Internal state of streams and of the engine that drives them. Everything
// here is guarded by EngineImpl::mu.
#include <poll.h>
#include <sched.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"
#include "stream/readiness.hpp"
#include "stream/wire.hpp"

namespace rdmakit::stream::detail {

using Clock = std::chrono::steady_clock;

// wr_id: [slot:24][generation:8][kind:4][count:7][bytes:21]. Completions are
// routed by slot and checked against the generation, so a completion of a
// stream that was already destroyed is dropped, never applied to its
// successor. A send completion retires `count` sends (itself and the
// unsignaled inline sends before it) and frees `bytes` of the send buffer.
enum WrKind : uint64_t { kWrSend = 1, kWrRecv = 2 };
constexpr uint32_t kSignalEvery = 16;  // inline data sends per signaled one
// A busy-polling wait yields its core only after spinning this long.
constexpr std::chrono::microseconds kSpinBeforeYield{5};
// How long a busy-polling write waits for ring room before it buffers.
constexpr std::chrono::microseconds kRoomWait{200};
static_assert(kSignalEvery < 128, "count fits its 7 bits");
constexpr uint64_t make_wr_id(uint32_t slot, uint8_t gen, WrKind kind, uint32_t bytes,
                              uint32_t count = 1) {
  return (static_cast<uint64_t>(slot) << 40) | (static_cast<uint64_t>(gen) << 32) |
         (static_cast<uint64_t>(kind) << 28) |
         (static_cast<uint64_t>(count & 0x7F) << 21) | (bytes & 0x1FFFFFu);
}
constexpr uint32_t wr_bytes(uint64_t wr_id) { return wr_id & 0x1FFFFFu; }
constexpr uint32_t wr_count(uint64_t wr_id) { return (wr_id >> 21) & 0x7F; }

class EngineImpl;

class StreamCore {
 public:
  StreamCore(EngineImpl& engine, const StreamOptions& options)
      : engine(engine), opt(options) {}

  EngineImpl& engine;
  StreamOptions opt;
  uint32_t slot = 0;
  uint8_t gen = 0;
  std::string peer;

  std::unique_ptr<MemoryRegion> rx;  // our ring, remote-writable
  std::unique_ptr<MemoryRegion> tx;  // send buffer, local only
  // Receive buffers for DATA records (wire::kRecordData bytes each, one per
  // posted receive: receive n uses buffer n % recv_credits; receives
  // complete in posted order). Destroyed after the QP.
  std::unique_ptr<std::byte[]> rec_buf;
  std::unique_ptr<MemoryRegion> rec_mr;
  uint64_t recv_posted = 0;
  std::unique_ptr<QueuePair> qp;
  RemoteRegion peer_ring;
  wire::Flow flow;

  // Send buffer: [tx_freed, tx_posted) in flight, [tx_posted, tx_staged) queued.
  uint64_t tx_staged = 0;
  uint64_t tx_posted = 0;
  uint64_t tx_freed = 0;
  uint32_t sends_outstanding = 0;  // posted, not yet retired by a completion
  uint32_t unsignaled = 0;         // inline sends since the last signaled one
  uint32_t send_depth = 0;
  uint32_t repost_pending = 0;  // receives consumed, re-posted in batches
  uint32_t repost_batch = 1;

  bool nonblocking = false;
  std::chrono::milliseconds read_timeout{0};
  std::chrono::milliseconds write_timeout{0};
  bool wr_shut = false;  // shutdown(SHUT_WR) or close(): FIN after the data
  bool fin_sent = false;
  bool rd_shut = false;
  bool closed = false;  // the handle is gone; finalize when drained
  // abort(): RST instead of FIN; rst_pending while no message credit is free.
  bool aborted = false;
  bool rst_pending = false;
  int err = 0;
  Status err_status = Status::kSuccess;
  bool err_hidden = false;  // Stream::hide_error(): no POLLERR any more
  // Liveness: message counts on the data path, turned into times by the
  // timers (resolution: one tick), so no message pays a clock read.
  uint64_t rx_msgs = 0;
  uint64_t tx_msgs = 0;
  uint64_t rx_seen = 0;
  uint64_t tx_seen = 0;
  Clock::time_point last_rx;
  Clock::time_point last_tx;
  Clock::time_point linger_deadline{};

  Readiness readiness;
  // While a caller that reads next polls (poll_readiness with reads_next):
  // the stream's becoming readable with data is not signalled on the
  // readiness fd (readiness_stale records it); the read that follows, which
  // takes the data, brings the fd up to date (EngineImpl::update).
  bool defer_readable = false;
  // Stream::set_lazy_readiness: defer_readable outside poll_readiness too.
  bool lazy_readiness = false;
  bool readiness_stale = false;
  // events() as of the last update(): what poll_readiness() reports while
  // another thread holds the engine lock.
  std::atomic<short> published{0};
  std::condition_variable cv;
  uint32_t waiters = 0;

  // --- called with the engine lock held
  bool readable() const noexcept {
    return flow.available() > 0 || flow.fin_received || rd_shut || err != 0;
  }
  uint64_t tx_free() const noexcept { return opt.tx_buffer - (tx_staged - tx_freed); }
  bool writable() const noexcept { return err != 0 || wr_shut || tx_free() > 0; }
  short events() const noexcept {
    short ev = 0;
    if (readable()) ev |= POLLIN;
    if (writable()) ev |= POLLOUT;
    if (flow.fin_received) ev |= POLLRDHUP;
    if (err != 0 || (flow.fin_received && fin_sent)) ev |= POLLHUP;
    if (err != 0 && !err_hidden) ev |= POLLERR;
    return ev;
  }
  // The readiness fd's end-of-stream, hang-up and error states (lock held,
  // before readiness.set()).
  void show_ended() noexcept {
    if ((err != 0 || flow.fin_received) && !readiness.hung_up())
      readiness.set_ended(true, err != 0 || fin_sent, err != 0 && !err_hidden);
  }
  size_t memory_bytes() const noexcept;
  // The receive that uses record buffer idx.
  RecvWr record_recv(uint32_t idx) const noexcept {
    return RecvWr{make_wr_id(slot, gen, kWrRecv, idx),
                  rec_buf.get() + static_cast<size_t>(idx) * wire::kRecordStride,
                  wire::kRecordData, rec_mr->lkey()};
  }
};

class EngineImpl : public std::enable_shared_from_this<EngineImpl> {
 public:
  explicit EngineImpl(const EngineOptions& options);
  ~EngineImpl();

  // Control path.
  std::shared_ptr<StreamCore> make_core(const StreamOptions& options);  // buffers
  void start(const std::shared_ptr<StreamCore>& core, std::unique_ptr<QueuePair> qp,
             const wire::Hello& peer);  // registers and posts receives
  QpOptions qp_options(const StreamOptions& options) const;
  static void validate(const StreamOptions& options);

  // Data path helpers (lock held).
  void pump(StreamCore& s) noexcept;
  void fail(StreamCore& s, int err, Status status) noexcept;
  void update(StreamCore& s) noexcept;  // readiness fd + waiters
  // Waits until pred() or the deadline; spins first when busy_poll is set.
  // Returns false on timeout.
  template <class Pred>
  bool wait(std::unique_lock<std::mutex>& lock, StreamCore& s, Clock::time_point deadline,
            Pred pred);
  void before_would_block() noexcept;  // the caller is about to return EAGAIN
  // Stream::poll_readiness: polls the CQ on the caller's thread (lock held).
  // reads_next: the caller reads s at once if it is readable (see
  // StreamCore::defer_readable).
  short poll_readiness(StreamCore& s, bool about_to_sleep,
                       bool reads_next = false) noexcept;
  void close(StreamCore& s) noexcept;
  // Abortive close: drops what is queued and unread, tells the peer RST.
  void abort(StreamCore& s) noexcept;
  void send_rst(StreamCore& s) noexcept;
  bool post_message(StreamCore& s, uint32_t imm) noexcept;  // CREDIT/CTRL
  // Re-posts the consumed receives (one post for several messages: the
  // post lock is taken once per batch); only posted ones are reported.
  bool flush_reposts(StreamCore& s) noexcept;

  std::mutex mu;
  EngineOptions options;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;
  std::vector<std::shared_ptr<StreamCore>> slots;
  std::vector<uint8_t> slot_gen;
  std::vector<uint32_t> free_slots;
  size_t live = 0;

 private:
  void drain() noexcept;  // polls the CQ until empty, dispatches
  void dispatch(const Completion& c) noexcept;
  void on_recv(StreamCore& s, const Completion& c) noexcept;
  void timers(Clock::time_point now) noexcept;
  void maybe_finalize(StreamCore& s) noexcept;
  void progress_loop() noexcept;
  void kick() noexcept;

  std::array<Completion, 32> batch_;
  enum class Progress { kRunning, kSleepArmed, kSleepUnarmed };
  Progress progress_ = Progress::kRunning;
  uint32_t spinning_ = 0;
  uint64_t spin_epoch_ = 0;
  // A caller is about to sleep on a stream: the progress thread must arm the
  // CQ now rather than nap unarmed because someone spun since its last look.
  bool sleeper_ = false;
  bool stop_ = false;
  int kick_fd_ = -1;
  std::chrono::milliseconds tick_{50};
  std::thread thread_;
};

template <class Pred>
bool EngineImpl::wait(std::unique_lock<std::mutex>& lock, StreamCore& s,
                      Clock::time_point deadline, Pred pred) {
  if (pred()) return true;
  if (s.opt.busy_poll.count() > 0) {
    ++spinning_;
    ++spin_epoch_;
    if (progress_ == Progress::kSleepArmed) {
      // Our polls disarm the CQ; the progress thread must not count on it.
      progress_ = Progress::kRunning;
      kick();
    }
    // The clock is first read after 64 spins: most waits of a ping-pong end
    // sooner, and two clock reads at the start of each were 13% of its
    // samples. The spin bounds count from there.
    Clock::time_point spin_until{};
    Clock::time_point yield_after{};
    for (uint32_t spins = 1; !pred(); ++spins) {
      if (spins % 64 == 0) {
        const auto now = Clock::now();
        if (spins == 64) {
          spin_until = std::min(deadline, now + s.opt.busy_poll);
          yield_after = now + kSpinBeforeYield;
        }
        if (now >= spin_until) break;
        // The peer may need this core (a loaded machine, or both ends on
        // one core): spinning through our time slice would stall it, and
        // us with it (measured: 0.8 GB/s instead of 5+ GB/s on one core).
        // With nothing else runnable this returns at once. Not in the first
        // microseconds of a wait: a message in flight arrives sooner, and a
        // yield it lands in costs it a system call.
        if (now >= yield_after) {
          lock.unlock();
          ::sched_yield();
          lock.lock();
        }
      }
      drain();
      if (pred()) break;
      // Other threads get the lock every few polls, not after each: an
      // unlock and lock per poll made each poll longer, and a message that
      // lands meanwhile waits for the rest of it.
      if (spins % 8 == 0) {
        lock.unlock();
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        lock.lock();
      }
    }
    --spinning_;
    if (pred()) return true;
  }
  sleeper_ = true;
  // A progress thread that armed while we spun may sleep on a CQ our polls
  // disarmed: send it back to look as well.
  if (progress_ == Progress::kSleepUnarmed ||
      (s.opt.busy_poll.count() > 0 && progress_ == Progress::kSleepArmed)) {
    progress_ = Progress::kRunning;
    kick();
  }
  ++s.waiters;
  const bool ok = s.cv.wait_until(lock, deadline, pred);
  --s.waiters;
  return ok;
}

}  // namespace rdmakit::stream::detail
