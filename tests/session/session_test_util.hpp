#pragma once
// Shared pieces of the session suite: options per provider and mode, and a
// server loop that serves in any thread/event mode until a condition holds.
#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "harness.hpp"
#include "rdmakit/session/session.hpp"

namespace rdmakit::session::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdmakit::test::RoleEnv;
using rdmakit::test::scaled;

inline SessionOptions options_for(const RoleEnv& env,
                                  ThreadMode tm = ThreadMode::kPollerPerEndpoint,
                                  EventMode em = EventMode::kBlocking) {
  SessionOptions o;
  o.provider = env.kind();
  o.thread_mode = tm;
  o.event_mode = em;
  o.workers = 2;
  o.recv_depth = 16;
  o.max_message = 1024;
  o.heartbeat = 50ms;
  o.liveness = scaled(1000ms);
  o.peer_timeout = scaled(1000ms);
  o.op_timeout = scaled(10000ms);
  o.connect_timeout = scaled(10000ms);
  return o;
}

// Runs the server (progress() in application mode, with the application's own
// epoll loop in epoll mode) until done() or the limit; returns done().
inline bool serve_until(Server& server, const SessionOptions& o,
                        const std::function<bool()>& done,
                        std::chrono::milliseconds limit = scaled(20000ms)) {
  const auto deadline = Clock::now() + limit;
  int epfd = -1;
  if (o.thread_mode == ThreadMode::kApplication && o.event_mode == EventMode::kEpollFd) {
    epfd = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    EXPECT_EQ(epoll_ctl(epfd, EPOLL_CTL_ADD, server.fd(), &ev), 0);
  }
  while (!done() && Clock::now() < deadline) {
    if (o.thread_mode != ThreadMode::kApplication) {
      std::this_thread::sleep_for(2ms);
    } else if (epfd >= 0) {
      epoll_event ev;
      if (server.arm()) epoll_wait(epfd, &ev, 1, 100);  // the arm rule
      server.progress();
    } else {
      server.progress(o.event_mode == EventMode::kBusyPoll ? 1ms : 20ms);
    }
  }
  if (epfd >= 0) ::close(epfd);
  return done();
}

}  // namespace rdmakit::session::test
