#pragma once
// SOCK_SEQPACKET messages carrying descriptors (SCM_RIGHTS): the control
// plane of the shm provider.
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "core/fd.hpp"

namespace rdmakit::shm {

using core::Fd;

// Abstract-namespace name for a port: shm peers meet by port only.
std::string abstract_name(uint16_t port);

// Returns bytes received, 0 on orderly shutdown, -errno on error or
// -ETIMEDOUT. Received descriptors are stored in fds (at most fds.size());
// *nfds says how many.
ssize_t recv_with_fds(int sock, void* buf, size_t len, std::span<Fd> fds, size_t* nfds,
                      std::chrono::milliseconds timeout);
// Returns 0 or -errno. dont_wait: -EAGAIN instead of blocking on a full socket.
int send_with_fds(int sock, const void* buf, size_t len, std::span<const int> fds,
                  bool dont_wait = false);

// A memfd of `bytes`, sealed against resizing (F_SEAL_SHRINK, F_SEAL_GROW,
// F_SEAL_SEAL): every memfd we hand a peer is one, so a peer holding it
// cannot truncate it under our mappings (a SIGBUS on our next access).
// Returns an empty Fd on failure (errno set).
Fd create_sealed_memfd(const char* name, size_t bytes);
// As create_sealed_memfd, but F_SEAL_SEAL is not yet set: the caller maps it
// writable first, then calls finish_seals().
Fd create_resizable_sealed_memfd(const char* name, size_t bytes);
// Seals what create_resizable_sealed_memfd left open. read_only_for_peers:
// also F_SEAL_FUTURE_WRITE, so no descriptor of this memfd (a dup, a
// /proc/PID/fd reopen) can ever be mapped writable or written again; our own
// writable mapping made before stays writable. Returns false (errno set).
bool finish_seals(int fd, bool read_only_for_peers);

// fd is a socket (fstat).
bool is_socket(int fd);

// The kernel's word on who is at the other end of a Unix socket: the
// connecting process (listener side) or the listening one (connector side).
struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
// False (errno set) if the kernel has no credentials for the socket.
bool peer_cred(int sock, PeerCred* cred);
// A descriptor a peer handed us is a memfd sealed against shrinking and at
// least `bytes` long: mapping it cannot fault past its end later.
bool sealed_and_sized(int fd, size_t bytes);

// mmap of a whole descriptor; nullptr on failure (errno set). populate:
// fault the pages in now (MAP_POPULATE), as registering memory with a NIC
// pins it, so the data path never takes a page fault on them. A region of
// more than kPopulateBytes gets only its first kPopulatePrefix populated, the
// rest allocated on first touch: a large region (a stream's 2 MiB ring) costs
// what is used, and a stream that rewinds to its ring's start (stream/wire.hpp)
// uses the first pages.
inline constexpr size_t kPopulateBytes = size_t{64} << 10;
inline constexpr size_t kPopulatePrefix = size_t{16} << 10;
void* map_fd(int fd, size_t length, bool writable, bool populate = false);

}  // namespace rdmakit::shm
