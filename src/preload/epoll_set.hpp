#pragma once
// Every epoll set the application creates, with its registrations as
// epoll_ctl made them (events and epoll_data), so that epoll_wait can answer
// level-triggered registrations of upgraded connections from the rings in
// user space (docs/preload.md, "epoll"), as libvma does:
//
// - A set is answered in user space ("user mode") while: this process
//   created it (epoll_create*, so every registration passed through the
//   epoll_ctl hook) and it is not a forked child's copy; every upgraded
//   registration is plain level-triggered (no EPOLLET, EPOLLONESHOT,
//   EPOLLEXCLUSIVE, EPOLLWAKEUP); no kernel registration shares an
//   epoll_data value with an upgraded one (kernel answers are told apart
//   by it); and the kernel never looked at the set itself (added to another
//   epoll set, or polled). Anything else keeps the kernel as the judge, as
//   before (readiness sockets current, every kernel semantic exact).
// - In user mode the readiness of an upgraded connection is read from the
//   stream (Stream::last_events after one drain per engine); the kernel set
//   is asked (zero timeout) for the other fds when user space has nothing,
//   and otherwise every kKernelEvery-th call with room kept for its answer,
//   so a listener or a pipe in the same set is never starved. Kernel answers
//   whose epoll_data belongs to an upgraded registration are dropped (user
//   space answered for it): no event twice in one call.
// - The connections of a user-mode set have lazy readiness
//   (Stream::set_lazy_readiness): data arriving is not signalled on their
//   readiness sockets (two syscalls per message spared). Before any thread
//   sleeps in the kernel on the set, lazy readiness is turned off for all of
//   them (the sockets become current); a connection that is in a second
//   epoll set, or that a poll/select/blocking call waits on, stays eager for
//   good.
#include <sys/epoll.h>

#include <vector>

#include "wait_spin.hpp"

namespace rdmakit::preload {

// Upgraded readiness is read from user space at most this many calls in a
// row while it has answers; then the kernel set is asked as well.
constexpr unsigned kKernelEvery = 8;

// The application created epfd (epoll_create, epoll_create1).
void epoll_created(int epfd) noexcept;
// epfd is a set the application created in this process (tracked).
bool epoll_set_of_this_process(int epfd) noexcept;
// Every set this process created and still holds.
std::vector<int> epoll_sets_of_this_process();
// fd's registration in epfd was moved by the library from the kernel socket
// it named to the upgraded connection's readiness socket (early_send.hpp).
void epoll_registration_moved(int epfd, int fd, const epoll_event& ev) noexcept;
// After a successful epoll_ctl(epfd, op, fd, ev).
void track_epoll_ctl(int epfd, int op, int fd, const epoll_event* ev) noexcept;
// epoll_ctl of an upgraded connection in a user-mode set, answered in
// user space (no syscall; the kernel's registration is made level before
// any kernel wait on the set). false, touching nothing, when the kernel
// must answer (the set's upgraded registrations are then made level first).
bool user_epoll_ctl(int epfd, int op, int fd, const epoll_event* ev,
                    int* result) noexcept;
// epfd is closed (or its number reused): whatever was tracked is stale.
void forget_epoll(int epfd) noexcept;
// In a forked child: the parent's sets are dropped (leaked: another parent
// thread may have held a set's lock at the fork), so the inherited ones are
// untracked and go to the kernel.
void forget_epoll_sets_in_child() noexcept;
// The kernel is about to look at fd from outside (fd added to another epoll
// set, or given to poll/select): if it is a tracked epoll set, it leaves user
// mode for good (its connections' readiness sockets become current).
void epoll_seen_by_kernel(int fd) noexcept;
// The kernel is about to look at c's readiness socket outside its epoll
// set (poll, select, a blocking call's sleep): c's readiness stays current
// from now on.
void keep_readiness_current(Conn& c) noexcept;
// Adds the engines of epfd's upgraded connections to d; false if none.
bool epoll_engines(int epfd, EngineDrain* d) noexcept;

// epoll_wait in user mode (see above). Returns false, touching nothing,
// when epfd is not in user mode; else true with *result as epoll_wait's.
bool user_epoll_wait(int epfd, epoll_event* events, int max, int timeout,
                     int* result) noexcept;

// Before a kernel wait on epfd that is not user_epoll_wait's (epoll_pwait,
// epoll_pwait2): while it lives, the set's readiness sockets are current
// and the progress thread watches for arrivals.
class KernelEpollWait {
 public:
  explicit KernelEpollWait(int epfd) noexcept;
  ~KernelEpollWait();
  KernelEpollWait(const KernelEpollWait&) = delete;
  KernelEpollWait& operator=(const KernelEpollWait&) = delete;

 private:
  void* set_ = nullptr;
};

}  // namespace rdmakit::preload
