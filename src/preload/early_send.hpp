#pragma once
// A client's first bytes on a same-host connection whose server has not
// taken the offer up yet (docs/preload.md, "Early bytes"). Kernel TCP would
// buffer them at once; waiting for the server instead can cost the whole
// rendezvous budget when the server uses the connection only after the
// client does something else (an iterative server still serving the
// client's previous connection). So after a short grace they go to kernel
// TCP at once, and a copy is kept: if the upgrade happens later, the client
// writes the copy first on the stream and the server drops as many bytes
// from its kernel socket; if not, they are where kernel TCP needs them.
// A library thread (the answerer) settles such a connection as soon as its
// server starts to take the offer up, whatever the application is doing.
#include <sys/epoll.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

struct Pending;

// How long a first send waits for the server to start taking the offer up.
constexpr auto kFirstSendGrace = std::chrono::milliseconds(1);

// fork(): the answerer's lock is held across it; in the child its thread,
// entries and wake descriptor are the parent's and are dropped.
void early_lock_for_fork() noexcept;
void early_unlock_after_fork() noexcept;
void forget_answerer_in_child() noexcept;

// The answerer settles fd, a connect()ed connection still pending (p), once
// its server starts to take the offer up. Once per connection.
void watch_offer(int fd, const std::shared_ptr<Pending>& p) noexcept;

// A wait (poll, select) only to write on fd, a connection whose first sends
// would go early now: the kernel socket answers it, nothing is settled.
bool wait_to_send_in_kernel(int fd) noexcept;

// One send's early path. Active when fd is a connect()ed same-host
// connection of this process alone, not settled, whose server has not
// started to take the offer up (within kFirstSendGrace for the first
// send), and the bytes fit wire::kMaxEarlyBytes: the caller then makes its
// kernel call and hands the result to done(). Holds the connection's
// settle lock meanwhile.
class EarlySend {
 public:
  EarlySend(int fd, const iovec* iov, int iovcnt) noexcept;
  ~EarlySend();
  EarlySend(const EarlySend&) = delete;
  EarlySend& operator=(const EarlySend&) = delete;

  explicit operator bool() const noexcept { return p_ != nullptr; }
  // Keeps a copy of the `sent` bytes the kernel took; returns sent.
  ssize_t done(ssize_t sent) noexcept;

 private:
  std::shared_ptr<Pending> p_;
  std::unique_lock<std::mutex> lock_;
  int fd_ = -1;
  const iovec* iov_ = nullptr;
  int iovcnt_ = 0;
};

// epoll_ctl on such a connection. An ADD into a set this process created
// registers the kernel socket and leaves the connection unsettled (an event
// loop registers a connect()ed socket before it sends): the upgrade, which
// the answerer makes as soon as the server takes the offer up, moves the
// registration to the readiness socket (kernel_registrations.hpp), so a
// wait on the set sees the stream. A MOD or DEL of a registration the
// upgrade would move waits for a settle in progress. Active: the caller
// makes its kernel call while this holds the settle lock, then calls done()
// with the result. One-shot and exclusive registrations are not taken (the
// caller settles first, as for any use).
class EarlyEpoll {
 public:
  EarlyEpoll(int epfd, int op, int fd, const epoll_event* ev) noexcept;
  ~EarlyEpoll();
  EarlyEpoll(const EarlyEpoll&) = delete;
  EarlyEpoll& operator=(const EarlyEpoll&) = delete;

  explicit operator bool() const noexcept { return p_ != nullptr; }
  int done(int result) noexcept;

 private:
  std::shared_ptr<Pending> p_;
  std::unique_lock<std::mutex> lock_;
  int op_ = 0;
  int fd_ = -1;
};

}  // namespace rdmakit::preload
