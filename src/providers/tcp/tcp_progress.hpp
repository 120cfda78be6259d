#pragma once
// Progress of the tcp provider: the per-context progress thread that serves
// the sockets of every queue pair (one-sided requests are executed at the
// target even when nobody polls there), with the region table they are
// executed against, and the spin lock a queue pair's drivers (poller,
// poster, progress thread) share.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/fd.hpp"
#include "providers/tcp/tcp_mr.hpp"

namespace rdmakit::tcp {

int64_t now_ns() noexcept;

// Test-and-test-and-set lock: held for a few hundred nanoseconds by whoever
// drives a queue pair (poller, poster or the progress thread).
class SpinLock {
 public:
  bool try_lock() noexcept {
    return !flag_.load(std::memory_order_relaxed) &&
           !flag_.exchange(true, std::memory_order_acquire);
  }
  void lock() noexcept;
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

class TcpQp;

// Per-context progress: region table, progress thread, epoll set of
// sockets. Every object of the context holds it, so it outlives them all.
class TcpProgress : public std::enable_shared_from_this<TcpProgress> {
 public:
  explicit TcpProgress(bool progress_thread);
  ~TcpProgress();
  MrTable& mrs() noexcept { return mrs_; }
  uint32_t next_qp_num() noexcept { return qp_num_.fetch_add(1); }
  void add_qp(TcpQp* qp);
  void remove_qp(TcpQp* qp) noexcept;
  void kick() noexcept;  // wake the progress thread
  // Removes a region: later accesses fail at once, and the call returns when
  // no transfer pins it. A QP whose transfer still holds it after that QP's
  // peer_timeout is cut (to error, as a NIC's on a destroyed MR), so a peer
  // cannot hold a deregistration hostage by trickling a WRITE or reading a
  // READ response slowly.
  void deregister(MrEntry* entry) noexcept;

 private:
  void run() noexcept;
  MrTable mrs_;
  std::atomic<uint32_t> qp_num_;
  std::mutex mu_;  // guards qps_; held by the thread while it serves them
  std::vector<TcpQp*> qps_;
  core::Fd epoll_fd_;
  core::Fd wake_fd_;
  bool with_thread_;
  // After serving a socket event the thread polls epoll without sleeping
  // for this long (RDMAKIT_TCP_PROGRESS_SPIN_US, default 20, 0 = never), as
  // a CQ's waiter spins before it sleeps: back-to-back one-sided requests
  // then cost no sleep and wake-up each.
  int64_t spin_ns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace rdmakit::tcp
