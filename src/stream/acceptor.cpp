#include "stream/acceptor.hpp"

#include <cerrno>
#include <cstdio>

#include "rdmakit/detail/library_thread.hpp"
#include "stream/engine.hpp"

namespace rdmakit::stream::detail {

Acceptor::Acceptor(AcceptOnce accept_once) : accept_once_(std::move(accept_once)) {
  const int rc = readiness_.open();
  if (rc < 0) throw Error("stream listener fd", "stream", "", -rc, "socketpair");
  readiness_.set(false, false);
  thread_ = rdmakit::detail::start_library_thread([this] { loop(); });
}

Acceptor::~Acceptor() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Streams never taken: closed as a dropped Stream is (the peer reads end
  // of stream).
  for (auto& core : ready_) {
    std::lock_guard lock(core->engine.mu);
    core->engine.close(*core);
  }
}

std::shared_ptr<StreamCore> Acceptor::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !ready_.empty(); })) return nullptr;
  auto core = std::move(ready_.front());
  ready_.pop_front();
  readiness_.set(!ready_.empty(), false);
  cv_.notify_all();  // room in the backlog
  return core;
}

void Acceptor::loop() noexcept {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (ready_.size() >= kBacklog) {
      cv_.wait(lock, [this] { return stop_ || ready_.size() < kBacklog; });
      continue;
    }
    lock.unlock();
    std::shared_ptr<StreamCore> core;
    bool failed = false;
    try {
      core = accept_once_(kAttempt);
    } catch (const Error& e) {
      // Nobody connected: look at stop_ and try again. Anything else is
      // that one connection's failure (a peer that is not a stream
      // endpoint, the engine full): said, and the listener goes on.
      if (e.sys_errno() != ETIMEDOUT) {
        std::fprintf(stderr, "rdmakit stream: background accept: %s\n", e.what());
        failed = true;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdmakit stream: background accept: %s\n", e.what());
      failed = true;
    }
    lock.lock();
    if (core) {
      ready_.push_back(std::move(core));
      readiness_.set(true, false);
      cv_.notify_all();
    } else if (failed) {
      // A listener that fails at once (out of fds, ...) is not spun on.
      cv_.wait_for(lock, std::chrono::milliseconds(10), [this] { return stop_; });
    }
  }
}

}  // namespace rdmakit::stream::detail
