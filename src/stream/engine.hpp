#pragma once
// The engine: one context, one shared completion queue, one progress thread,
// and the protocol of every stream on it (see wire.hpp, docs/streams.md).
// Everything here is guarded by EngineImpl::mu. Its functions, by concern:
//   engine.cpp           the engine's and its streams' lifetimes
//   engine_tx.cpp        pump: queued data, credits and FIN out
//   engine_rx.cpp        completions: dispatch, receives, re-posting
//   engine_timers.cpp    keepalive, dead peers, linger
//   engine_progress.cpp  the progress thread, readiness polls, wait()
#include <sched.h>

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "rdmakit/detail/spin.hpp"
#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"
#include "stream/stream_core.hpp"
#include "stream/wire.hpp"

namespace rdmakit::stream::detail {

// A busy-polling wait yields its core only after spinning this long.
constexpr std::chrono::microseconds kSpinBeforeYield{5};
// How long a busy-polling write waits for ring room before it buffers.
constexpr std::chrono::microseconds kRoomWait{200};

class EngineImpl : public std::enable_shared_from_this<EngineImpl> {
 public:
  explicit EngineImpl(const EngineOptions& options);
  ~EngineImpl();

  // --- Control path (engine.cpp)
  std::shared_ptr<StreamCore> make_core(const StreamOptions& options);  // buffers
  void start(const std::shared_ptr<StreamCore>& core, std::unique_ptr<QueuePair> qp,
             const wire::Hello& peer);  // a slot; the receives posted
  QpOptions qp_options(const StreamOptions& options) const;
  static void validate(const StreamOptions& options);
  size_t stream_count() const noexcept { return live_; }  // lock held
  // close(): the handle is gone; queued data still goes out, then FIN.
  void close(StreamCore& s) noexcept;
  // Abortive close: drops what is queued and unread, tells the peer RST.
  void abort(StreamCore& s) noexcept;

  // --- Data path (lock held)
  // Posts what the stream may send now: queued data, a CREDIT, the FIN
  // (engine_tx.cpp).
  void pump(StreamCore& s) noexcept;
  // Waits until pred() or the deadline; spins first when busy_poll is set.
  // Returns false on timeout.
  template <class Pred>
  bool wait(std::unique_lock<std::mutex>& lock, StreamCore& s, Clock::time_point deadline,
            Pred pred);
  void before_would_block() noexcept;  // the caller is about to return EAGAIN
  // Stream::poll_readiness: polls the CQ on the caller's thread (lock held).
  // reads_next: the caller reads s at once if it is readable (see
  // StreamCore::begin_poll).
  short poll_readiness(StreamCore& s, bool about_to_sleep,
                       bool reads_next = false) noexcept;

  std::mutex mu;
  const EngineOptions options;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompletionQueue> cq;

 private:
  void drain() noexcept;  // polls the CQ until empty, dispatches
  void dispatch(const Completion& c) noexcept;
  void on_recv(StreamCore& s, const Completion& c) noexcept;
  // Re-posts the consumed receives (one post for several messages: the
  // post lock is taken once per batch); only posted ones are reported.
  bool flush_reposts(StreamCore& s) noexcept;
  void timers(Clock::time_point now) noexcept;
  // Frees the slot of a closed stream that is done.
  void maybe_finalize(StreamCore& s) noexcept;
  void progress_loop() noexcept;
  void kick() noexcept;

  std::vector<std::shared_ptr<StreamCore>> slots_;
  std::vector<uint8_t> slot_gen_;
  std::vector<uint32_t> free_slots_;
  size_t live_ = 0;
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
        rdmakit::detail::cpu_relax();
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
  return s.sleep_until(lock, deadline, pred);
}

}  // namespace rdmakit::stream::detail
