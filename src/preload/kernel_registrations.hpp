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
// The epoll_ctl hook notes which set registered a number that is not an
// upgraded connection; the upgrade reads those sets back from the kernel
// (/proc/self/fdinfo/EPFD: the registration's events, data and the inode of
// the file it names), takes off those on the kernel socket before the
// numbers change and adds them, unchanged, on the readiness socket after.
// Only sets this process created are touched (a forked child's copy of its
// parent's set is the parent's).
#include <sys/epoll.h>
#include <sys/types.h>

#include <vector>

namespace rdmakit::preload {

// After a successful epoll_ctl(epfd, op, fd) on a number that is not an
// upgraded connection (ADD notes the set, DEL forgets it).
void note_kernel_registration(int epfd, int op, int fd) noexcept;
// A set noted for fd may hold a registration of it.
bool has_kernel_registration(int fd) noexcept;
bool has_kernel_registration(int epfd, int fd) noexcept;

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
