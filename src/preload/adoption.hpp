#pragma once
// Which process carries a connection that several processes hold before any
// of them has used it (an accept or a connect followed by fork, exec or
// SCM_RIGHTS). The
// first holder to settle it claims it in the connection's adoption marker
// (<dir>/a-<hash of the 4-tuple>); a holder that comes second waits for that
// claim to end and then follows it: a relay through the owner when the
// claim upgraded the connection, kernel TCP when it did not. So two holders
// never settle one connection two ways (one on a stream, one writing to the
// kernel socket the peer no longer reads). The marker also names the kernel
// socket's inode: a marker left by an earlier connection with the same
// 4-tuple is stale and ignored. The first to settle is the first to use it,
// except for a connect()ed one forked before its first use: the process
// that connected settles it (handoff.hpp) and its children follow.
#include <sys/types.h>

#include <chrono>
#include <string>

namespace rdmakit::preload {

enum class Holder : char {
  kNone = 0,       // no claim
  kClaimed = 'c',  // a holder is settling it
  kOwned = 'o',    // upgraded: the holder carries the stream
  kKernel = 'k',   // settled on kernel TCP
};

struct Adoption {
  Holder holder = Holder::kNone;
  pid_t pid = 0;      // the holder that claimed or settled it
  bool alive = true;  // that process still exists
};

struct AdoptionMarker {
  std::string path;  // "" when the rendezvous directory is unusable
  ino_t socket = 0;  // the kernel socket's inode
};

// The marker of tcp_fd's end of its connection (path "" when it has none).
AdoptionMarker adoption_marker_of(int tcp_fd, bool client);

// The marker as it stands; one of another connection reads as kNone.
Adoption read_adoption(const AdoptionMarker& m);

// Claims the connection for this process. false: another live holder
// claimed or settled it first; *other is how it stands once its claim has
// ended, or as it stood at deadline. A claim whose holder has exited is
// taken over.
bool claim_adoption(const AdoptionMarker& m,
                    std::chrono::steady_clock::time_point deadline, Adoption* other);

// How this process's claim ended.
void mark_adoption(const AdoptionMarker& m, Holder outcome);

}  // namespace rdmakit::preload
