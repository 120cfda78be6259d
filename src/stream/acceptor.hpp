#pragma once
// A listener in event-loop mode: a thread accepts connections in the
// background (as the kernel does for a socket's backlog) and queues the
// connected streams; the readiness fd is readable while the queue is not
// empty, and accept() takes from the queue without waiting when asked to.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "rdmakit/rdmakit.hpp"
#include "rdmakit/stream/stream.hpp"
#include "stream/readiness.hpp"

namespace rdmakit::stream::detail {

class StreamCore;

class Acceptor {
 public:
  // Streams queued and not yet taken; further connections wait in the
  // provider's own queue until one is taken.
  static constexpr size_t kBacklog = 128;

  // One accept attempt on the listener: a started stream, or throws Error
  // (ETIMEDOUT when nobody connected within the timeout).
  using AcceptOnce =
      std::function<std::shared_ptr<StreamCore>(std::chrono::milliseconds)>;
  // How long one attempt may wait: also how long stopping may take.
  static constexpr std::chrono::milliseconds kAttempt{250};

  // From now on only the acceptor's thread accepts on the listener. Throws
  // Error if the readiness fd cannot be created.
  explicit Acceptor(AcceptOnce accept_once);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  int fd() const noexcept { return readiness_.fd(); }
  // A queued stream's core, or nullptr after `timeout` (0: do not wait).
  std::shared_ptr<StreamCore> take(std::chrono::milliseconds timeout);

 private:
  void loop() noexcept;

  AcceptOnce accept_once_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<StreamCore>> ready_;
  Readiness readiness_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rdmakit::stream::detail
