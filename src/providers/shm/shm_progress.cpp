#include "providers/shm/shm_progress.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_layout.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {

ShmProgress::ShmProgress(ShmContext& context) : context_(context) {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  stop_event_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_ || !stop_event_) throw Error("epoll/eventfd", "shm", "", errno, "");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, stop_event_.get(), &ev);
  thread_ = rdmakit::detail::start_library_thread([this] { run(); });
}

ShmProgress::~ShmProgress() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_event_.get(), &one, sizeof one);
  thread_.join();
}

void ShmProgress::add_link(const std::shared_ptr<Link>& link) {
  std::lock_guard lock(mutex_);
  link->id = next_link_id_++;
  links_.emplace(link->id, link);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = link->id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, link->serve_socket.get(), &ev) != 0) {
    links_.erase(link->id);
    throw Error("epoll_ctl(link)", "shm", "", errno, "");
  }
}

void ShmProgress::remove_link(const std::shared_ptr<Link>& link) {
  std::lock_guard lock(mutex_);
  if (links_.erase(link->id) != 0) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, link->serve_socket.get(), nullptr);
  }
}

void ShmProgress::mark_gone(Link& link) {
  link.peer_gone.store(true, std::memory_order_release);
  const uint64_t one = 1;
  for (const auto* wake : {&link.send_cq_wake, &link.recv_cq_wake}) {
    if (*wake) {
      [[maybe_unused]] const ssize_t n = ::write((*wake)->get(), &one, sizeof one);
    }
  }
}

void ShmProgress::run() {
  epoll_event events[32];
  for (;;) {
    const int n = ::epoll_wait(epoll_.get(), events, 32, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      core::log().error("shm: progress thread epoll_wait failed: {}",
                        std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) return;  // stop
      std::shared_ptr<Link> link;
      {
        std::lock_guard lock(mutex_);
        auto it = links_.find(events[i].data.u64);
        if (it == links_.end()) continue;
        link = it->second;
      }
      if ((events[i].events & EPOLLIN) != 0) serve_request(*link);
      if ((events[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) != 0 &&
          !link->peer_gone.load()) {
        mark_gone(*link);
      }
      if (link->peer_gone.load()) remove_link(link);
    }
  }
}

void ShmProgress::serve_request(Link& link) {
  Request request{};
  size_t nfds = 0;
  const ssize_t got = recv_with_fds(link.serve_socket.get(), &request, sizeof request, {},
                                    &nfds, std::chrono::milliseconds(0));
  if (got == 0 || (got < 0 && got != -EAGAIN && got != -ETIMEDOUT)) {
    mark_gone(link);
    return;
  }
  if (got != static_cast<ssize_t>(sizeof request)) return;  // malformed: ignore

  Fd region_fd;
  const Reply reply = context_.answer(request, link.other_user, &region_fd);
  // Never blocks: one peer that does not read its replies must not stall
  // this thread, which serves every peer of the context. A requester waits
  // for each reply, so a full socket means a misbehaving peer: it is dropped.
  const int fd = region_fd.get();
  if (send_with_fds(link.serve_socket.get(), &reply, sizeof reply,
                    fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>(),
                    true) != 0) {
    mark_gone(link);
  }
}

}  // namespace rdmakit::shm
