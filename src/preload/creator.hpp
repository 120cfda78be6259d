#pragma once
// A connect()ed connection held by processes other than the one that
// connected it, before its first use: a forked child, an exec'd image, a
// receiver of SCM_RIGHTS. Its offer (rendezvous.hpp) lives in the creator,
// whose answerer settles the connection when the server takes the offer up
// (early_send.hpp); the other holders wait for that and follow it
// (adoption.hpp): a relay through the creator, or kernel TCP. So a helper
// that writes the request and exits, or a shell's child that reads the
// answer, neither takes the stream with it nor writes to a kernel socket
// the server no longer reads.
#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "adoption.hpp"

namespace rdmakit::preload {

// How a forked copy's wait for its creator ended.
enum class CreatorWait : uint8_t {
  kSettled,  // *other: how the creator settled it; the caller follows
  kLetGo,    // the creator closed its copy or exited: the caller settles it
  // The creator still holds it and did not settle it within the budget (a
  // server slow to take the offer up): the caller keeps it on kernel TCP,
  // which the creator then follows. Upgraded by the caller, it would die
  // with the caller, under the creator's copy.
  kStillHeld,
};

// A forked copy (the creator's pid known): waits while the creator is alive
// and holds its copy under one of `aliases`.
CreatorWait await_creator(const AdoptionMarker& m, pid_t creator,
                          const std::vector<int>& aliases, Adoption* other);

// Whether tcp_fd is the connect()ed end of a connection a process of this
// user offered to upgrade: its offer is outstanding, or its marker shows
// it was claimed. For a socket that came across exec or SCM_RIGHTS, whose
// Pending (and offer) stayed behind in the creator.
bool offered_by_a_connect(int tcp_fd);

// At exec, a connect()ed end that no holder has claimed yet: claimed for
// kernel TCP, so the creator (and any other holder) follows that. The new
// program may read or write it through stdio, whose libc-internal calls
// the hooks do not see: a stream would lose those bytes. true: claimed (the
// fd is a plain kernel socket); false: another holder claimed it first.
bool keep_on_kernel_at_exec(int tcp_fd);

// An exec'd or received copy of such a connection (the creator unknown):
// waits while its offer is outstanding or a claim on it is in progress.
// true with *other once it is settled; false when nobody will settle it
// (the offer is gone and unclaimed) or at the budget.
bool await_offer_taken(const AdoptionMarker& m, int tcp_fd, Adoption* other);

}  // namespace rdmakit::preload
