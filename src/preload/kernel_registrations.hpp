#pragma once
// epoll registrations that name a connection's kernel socket, moved to its
// readiness socket when the connection is upgraded.
//
// The kernel keys a registration by (file, fd number). The upgrade puts the
// readiness socket under the connection's numbers and keeps the kernel
// socket open at a high number, so a registration made before the upgrade
// would stay on the kernel socket, which never carries the stream's data: a
// set would report the connection only when the kernel socket changes (its
// FIN), and an edge-triggered reader that stopped at a short read would
// sleep for good. Event loops register a socket before connect() (nginx's
// upstreams) or before the server took the offer up (early_send.hpp).
//
// The epoll_ctl hook notes, per number that is not an upgraded connection,
// the set that registered it and with what events and data. Before the
// numbers change, the upgrade deletes that registration (the kernel finds it
// by the file the number names then: a DELETE that succeeds was the kernel
// socket's) and adds it, unchanged, on the readiness socket after. A number
// registered in several sets, or one-shot (fired or not), is read back from
// the kernel instead (/proc/self/fdinfo/EPFD: events, data and the inode of
// the file each registration names). Only sets this process created are
// touched (a forked child's copy of its parent's set is the parent's).
// The caller holds the connection's settle lock, which an epoll_ctl on a
// connection not settled yet waits for (early_send.hpp).
#include <sys/epoll.h>
#include <sys/types.h>

#include <vector>

namespace rdmakit::preload {

// After a successful epoll_ctl(epfd, op, fd, ev) on a number that is not an
// upgraded connection: ADD and MOD note the set and the registration, DEL
// forgets it.
void note_kernel_registration(int epfd, int op, const epoll_event* ev, int fd) noexcept;
// fd was closed: nothing of its is registered any more.
void forget_kernel_registrations(int fd) noexcept;

struct KernelRegistration {
  int epfd;
  int fd;
  epoll_event ev;
};

// A set's registrations as the kernel holds them (/proc/self/fdinfo/EPFD:
// "tfd: FD events: HEX data: HEX pos: N ino: HEX ..."), with the inode of
// the file each names. false when they cannot be read.
struct HeldRegistration {
  int fd;
  epoll_event ev;
  ino_t ino;
};
bool read_registrations(int epfd, std::vector<HeldRegistration>* out);

// Before the numbers change: takes the registrations of `aliases` whose
// file is the inode `kernel_ino` off the kernel socket, and returns them.
std::vector<KernelRegistration> take_kernel_registrations(const std::vector<int>& aliases,
                                                          ino_t kernel_ino);
// After: registers them again, as they were, on what the numbers now name.
void put_back_registrations(const std::vector<KernelRegistration>& regs) noexcept;

}  // namespace rdmakit::preload
