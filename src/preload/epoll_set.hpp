#pragma once
// Which upgraded connections each epoll instance watches (epoll_ctl), so
// epoll_wait knows whether its set holds any and which engines to drain
// before it asks the kernel (wait_spin.hpp). The kernel stays the judge of
// what epoll_wait reports: after a drain the readiness sockets are current,
// so level-triggered, EPOLLET, EPOLLONESHOT, EPOLLEXCLUSIVE and nested sets
// keep their exact kernel semantics.
#include "wait_spin.hpp"

namespace rdmakit::preload {

// After a successful epoll_ctl(epfd, op, fd).
void track_epoll_ctl(int epfd, int op, int fd) noexcept;
// A new descriptor with this number: whatever was tracked for it is stale.
void forget_epoll(int epfd) noexcept;
// Adds the engines of epfd's upgraded connections to d; false if none.
bool epoll_engines(int epfd, EngineDrain* d) noexcept;

}  // namespace rdmakit::preload
