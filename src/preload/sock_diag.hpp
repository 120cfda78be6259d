#pragma once
// The kernel's word on who created a TCP socket (NETLINK_SOCK_DIAG, as ss
// uses): the cross-user rendezvous checks a peer's SO_PEERCRED uid against
// the uid that owns the connection's other end, never against what the peer
// says.
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

// The uid that created the socket of the connection's client end (the
// tuple's client address and port, connected to its server end), or
// nullopt when the kernel has no such socket.
std::optional<uid_t> client_socket_uid(const wire::Tuple& t);
// The inode of that socket (nullopt: none, or the kernel did not say).
std::optional<ino_t> client_socket_inode(const wire::Tuple& t);
// The uids owning TCP sockets that listen on `port` (any address, both
// families). Empty when none or when the query fails.
std::vector<uid_t> listener_uids(uint16_t port);
// The inodes of every TCP socket of this network namespace that a process
// holds, sorted; nullopt when the kernel's answer could not be read whole.
std::optional<std::vector<ino_t>> tcp_socket_inodes();

}  // namespace rdmakit::preload
