// The blocking wrappers (write_sync, read_sync, write_with_imm_sync): an
// asynchronous operation started with a callback, then waited for up to
// op_timeout.
#include <condition_variable>
#include <rdmakit/session/channel.hpp>
#include <rdmakit/session/endpoint.hpp>

#include "channel_core.hpp"
#include "engine.hpp"

namespace rdmakit::session {

using detail::ChannelCore;
using detail::core;
using Clock = std::chrono::steady_clock;

OpResult Channel::write_sync(std::string_view remote, uint64_t offset, Local src,
                             size_t length) {
  return core(*this).sync(
      [&](OpCallback cb) { return write(remote, offset, src, length, std::move(cb)); });
}
OpResult Channel::read_sync(std::string_view remote, uint64_t offset, Local dst,
                            size_t length) {
  return core(*this).sync(
      [&](OpCallback cb) { return read(remote, offset, dst, length, std::move(cb)); });
}
OpResult Channel::write_with_imm_sync(std::string_view remote, uint64_t offset, Local src,
                                      size_t length, uint32_t imm) {
  return core(*this).sync([&](OpCallback cb) {
    return write_with_imm(remote, offset, src, length, imm, std::move(cb));
  });
}

// Waits for one operation: on the progress thread (or without library
// threads) by running the progress loop, elsewhere on a condition variable.
OpResult ChannelCore::sync(const std::function<OpResult(OpCallback)>& start) {
  if (app_progress_) return sync_progressing(start);
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    OpResult result;
  };
  auto waiter = std::make_shared<Waiter>();
  OpResult posted = start([waiter](const OpResult& r) {
    std::lock_guard lock(waiter->mu);
    waiter->result = r;
    waiter->done = true;
    waiter->cv.notify_all();
  });
  if (!posted.ok()) return posted;
  const auto timeout = op_timeout();
  const auto deadline = Clock::now() + timeout;
  detail::Worker* worker = endpoint_->worker_;
  const bool self_progress =
      app_progress_ || (worker != nullptr && worker->on_worker_thread());
  std::unique_lock lock(waiter->mu);
  while (!waiter->done) {
    const auto now = Clock::now();
    if (now >= deadline) {
      return fail(
          Errc::kTimeout, "operation",
          "no completion within op_timeout (" + std::to_string(timeout.count()) + " ms)");
    }
    if (self_progress && worker != nullptr) {
      lock.unlock();
      worker->run_once(std::chrono::milliseconds(1));
      lock.lock();
    } else {
      waiter->cv.wait_until(lock, deadline);
    }
  }
  return waiter->result;
}

struct ChannelCore::SyncFrame {
  uint64_t ticket = 0;
  bool done = false;
  OpResult result;
  SyncFrame* below = nullptr;
};

// Without library threads the callback runs on this thread (inside
// run_once), so the waiter is a frame on this stack: the callback captures
// the channel and the operation's number (two words, inside std::function's
// small buffer) and finds the frame while it waits; the callback of an
// operation whose caller timed out finds none and does nothing.
OpResult ChannelCore::sync_progressing(const std::function<OpResult(OpCallback)>& start) {
  SyncFrame frame;
  frame.ticket = ++sync_issued_;
  frame.below = sync_top_;
  sync_top_ = &frame;
  struct Pop {
    ChannelCore* ch;
    SyncFrame* frame;
    ~Pop() { ch->sync_top_ = frame->below; }
  } pop{this, &frame};
  OpResult posted = start([this, ticket = frame.ticket](const OpResult& r) {
    for (SyncFrame* f = sync_top_; f != nullptr; f = f->below) {
      if (f->ticket == ticket) {
        f->result = r;
        f->done = true;
        return;
      }
    }
  });
  if (!posted.ok()) return posted;
  detail::Worker* worker = endpoint_->worker_;
  const auto timeout = op_timeout();
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!frame.done) {
    if (Clock::now() >= deadline) {
      return fail(
          Errc::kTimeout, "operation",
          "no completion within op_timeout (" + std::to_string(timeout.count()) + " ms)");
    }
    if (worker == nullptr) return closed_result("operation");
    worker->run_once(std::chrono::milliseconds(1));
  }
  return std::move(frame.result);
}

}  // namespace rdmakit::session
