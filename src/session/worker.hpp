#pragma once
// The Worker: one CQ, the endpoints it serves, and the progress loop that runs
// on a library thread or in progress(). Its completion dispatch is in
// worker_dispatch.cpp, heartbeats, liveness and closing in worker_liveness.cpp.
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <rdmakit/rdmakit.hpp>
#include <rdmakit/session/endpoint.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "wire.hpp"

namespace rdmakit::session::detail {

class Engine;

class Worker {
 public:
  static constexpr size_t kBatch = 32;  // completions per poll

  Worker(Engine& engine, bool threaded, uint32_t capacity);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  CompletionQueue& cq() noexcept { return *cq_; }
  Listener* channel_listener();  // created on first use, for channels 1..n-1

  // Hands over a connected endpoint (any thread); the worker posts its RECVs,
  // sends the buffer table and serves it from then on.
  void adopt(std::shared_ptr<Endpoint> endpoint);
  // Gives the endpoint its slot (wr_id index); false if the worker is full.
  bool reserve(const std::shared_ptr<Endpoint>& endpoint);
  void wake() noexcept;

  // One pass of the progress loop: adopt, poll/wait (by event mode, up to
  // timeout), dispatch, heartbeats and liveness, closes. Returns completions.
  int run_once(std::chrono::milliseconds timeout);
  // One poll and dispatch, no wait; the clock is read (heartbeats, liveness)
  // only every 64 passes, empty or not. For loops that spin on a result
  // expected within microseconds (Channel::recv without library threads).
  int poll_pass();
  void start();
  void stop();
  // Per-endpoint mode: the thread ends once its endpoint is closed and
  // reaped; the Engine then joins it and drops the worker (sweep_retired).
  void retire_when_idle() noexcept { retire_when_idle_ = true; }
  bool retired() const noexcept { return retired_.load(std::memory_order_acquire); }
  // True once the endpoint this worker served has been destroyed.
  bool endpoints_gone() const;
  bool on_worker_thread() const noexcept;

  // Called from the completion path (this worker's thread).
  void fail_endpoint(Endpoint& ep, DisconnectReason reason, std::string detail);
  // The same for a failed completion; a flush waits for its cause (flushed_).
  void fail_endpoint_after(const Completion& c, Endpoint& ep, std::string detail);
  void on_control(Endpoint& ep, MsgKind kind, std::span<const std::byte> payload);
  void request_close() noexcept {
    close_pending_.store(true);
    wake();
  }
  // Closes every endpoint (goodbye to each peer) and destroys their QPs and
  // memory. Only with the worker's thread stopped.
  void shutdown();

  int fd() const noexcept { return epfd_; }
  bool arm() noexcept;
  size_t endpoints() const noexcept { return live_.load(); }

 private:
  void adopt_pending();
  void dispatch(const Completion& c);
  void dispatch_all(std::span<Completion> batch, int n);
  void tick(std::chrono::steady_clock::time_point now);
  void kill(Endpoint& ep, DisconnectInfo info);
  void reap(std::chrono::steady_clock::time_point now, bool all);
  void goodbye_left(uint64_t wr_id) noexcept;
  bool lingering(std::chrono::steady_clock::time_point now) const noexcept;
  void drain_fds() noexcept;
  void loop();
  int pass(std::chrono::milliseconds timeout, bool clock_when_idle);
  int wait_and_poll(std::span<Completion> batch, std::chrono::milliseconds timeout);

  Engine& engine_;
  bool threaded_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<Listener> channel_listener_;
  std::mutex listener_mu_;
  int epfd_ = -1;
  int wake_fd_ = -1;
  int timer_fd_ = -1;

  mutable std::mutex inbox_mu_;
  std::vector<std::shared_ptr<Endpoint>> inbox_;
  std::atomic<bool> inbox_pending_{false};
  std::atomic<bool> close_pending_{false};

  // Slot table (the endpoint index in wr_ids). Slots are reserved by any
  // thread (under slots_mu_) and freed by the worker; the completion path
  // reads the atomics only.
  uint32_t capacity_;
  std::mutex slots_mu_;
  std::vector<std::shared_ptr<Endpoint>> owners_;
  std::vector<uint32_t> free_slots_;
  std::unique_ptr<std::atomic<Endpoint*>[]> slot_ptr_;
  std::unique_ptr<std::atomic<uint16_t>[]> slot_gen_;
  struct Grave {
    std::shared_ptr<Endpoint> endpoint;
    std::chrono::steady_clock::time_point until;
    uint64_t goodbye = 0;  // wr_id of the goodbye still on its way, 0 if none
  };
  std::vector<Grave> graves_;  // closed endpoints whose QPs linger a moment
  std::atomic<size_t> live_{0};
  std::chrono::steady_clock::time_point next_tick_{};
  uint32_t polls_since_clock_ = 0;
  // The completion batch of the outermost pass, kept (not zeroed per pass);
  // a nested pass (a handler's send waiting for a credit) uses its own.
  std::array<Completion, kBatch> batch_{};
  uint32_t depth_ = 0;
  // Endpoints whose QP flushed a request, or found the peer gone
  // (RETRY_EXCEEDED): a consequence, and the completion that names the
  // cause (a failed WRITE's REMOTE_ACCESS_ERROR, the peer's goodbye) may
  // come later in the batch or in the next poll. Killed with this as reason
  // only if nothing better came.
  struct FlushSeen {
    Endpoint* endpoint;
    std::string detail;
  };
  std::vector<FlushSeen> flushed_;
  // Endpoints whose flushes named no cause: most often the peer's QP went
  // away as the peer closed, and its goodbye may still come (a clean close,
  // logged as such). Killed as a transport error if it has not come within
  // a short grace (kFlushGrace). Kept alive meanwhile.
  struct FlushWait {
    std::shared_ptr<Endpoint> endpoint;
    std::string detail;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<FlushWait> flush_wait_;
  void settle_flushes(std::chrono::steady_clock::time_point now);

  bool retire_when_idle_ = false;
  bool served_ = false;  // an endpoint was adopted (worker thread only)
  std::atomic<bool> retired_{false};
  std::vector<std::weak_ptr<Endpoint>> served_endpoints_;  // under inbox_mu_

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace rdmakit::session::detail
