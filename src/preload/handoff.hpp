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

#include <cstdint>
#include <memory>
#include <vector>

#include "relay.hpp"
#include "rendezvous.hpp"
#include "state.hpp"

namespace rdmakit::preload {

// accept(): fd is an accepted TCP connection; true when it was left
// pending (loopback), false when the caller decides at once.
bool defer_accepted(int fd);
// connect(): the kernel connect of fd to a same-host preloaded listener has
// started with `offer` published; the rendezvous finishes at fd's first use,
// so a client never waits in connect() for a server that has not yet used
// its end. false: not deferred (offer untouched).
bool defer_connect(int fd, PendingOfferPtr& offer);
// close() of fd: an accepted connection this process alone holds and never
// used is settled first, so a client waiting for it learns of the close at
// once (an upgraded stream that ends) instead of waiting out its budget.
void settle_before_close(int fd);
// In the parent after fork(): the connect()ed connections it has not
// settled are settled by its answerer as soon as their servers take the
// offers up, so that the process that connected carries each one while it
// holds a copy (a forked child follows it).
void watch_offers_after_fork() noexcept;
// fd's first use: a pending, inherited or foreign entry becomes an
// upgraded connection, a relayed one, or a plain kernel socket.
void settle(int fd);
// Before an exec whose new image will not load this library (its
// environment drops LD_PRELOAD, or the kernel ignores it for a setuid or
// file-capability program): each connection handed to the new program
// (fds 0-2, and 3 .. 3 + handed_fds - 1 as systemd's LISTEN_FDS says) is
// settled so that the plain program can use the kernel socket or relay it
// gets, and no client waits for a process that will never answer. `why`
// is logged as the reason. Never waits for a lock.
void settle_for_plain_exec(const char* why, int handed_fds);
// Settles an accepted connection no process has used yet on kernel TCP:
// its client's offer is refused with `status` (wire::kNotCarried or
// wire::kUsedOutside) and `why` is logged.
void settle_on_kernel(int fd, const char* why, uint32_t status);
// fd, if it still names pending entry p and nobody is settling or closing
// it: settled here (the other end of a connection this process settles on
// another thread, mirror.hpp; a connection whose server took up its early
// offer, early_send.hpp).
struct Pending;
void settle_if_pending(int fd, const std::shared_ptr<Pending>& p);
// Makes every alias the relay socket g granted (or, with none, keeps the
// first alias as the library's copy) and installs them as `kind` entries
// of one relayed connection. The other holders of a connection never see
// its bytes on kernel TCP again. false (g.why says why): nothing installed.
bool install_grant(const std::vector<int>& aliases, RelayGrant& g,
                   Entry kind = Entry::kDormant);

}  // namespace rdmakit::preload
