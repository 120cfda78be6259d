#pragma once
// Connections that change hands between processes (docs/preload.md,
// "Process shapes"). An accepted loopback connection is not upgraded inside
// accept(): it stays kPending until its first use, so a server that forks
// or execs per connection (the postmaster, sshd, inetd-style servers)
// upgrades it in the process that serves it. Connections that reach a
// process across exec or SCM_RIGHTS are recognised on their first use too,
// and one that another process already carries is relayed through it
// (relay.hpp).
#include <sys/socket.h>

namespace rdmakit::preload {

// accept(): fd is an accepted TCP connection; true when it was left
// pending (loopback), false when the caller decides at once.
bool defer_accepted(int fd);
// Load time: the descriptors inherited across exec.
void scan_inherited() noexcept;
// The application received descriptors (SCM_RIGHTS).
void note_received(const msghdr* msg) noexcept;
// fd's first use: a pending, inherited or foreign entry becomes an
// upgraded connection, a relayed one, or a plain kernel socket.
void settle(int fd);

}  // namespace rdmakit::preload
