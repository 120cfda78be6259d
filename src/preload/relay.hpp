#pragma once
// Relays: a process that holds a copy of a connection another process has
// upgraded (a forked child, an exec'd image, a receiver of SCM_RIGHTS)
// carries it through that process, which owns the stream. The owner serves
// relay requests on an abstract unix socket named by its pid; a request
// proves that the asker holds the connection by passing its descriptor
// (the kernel TCP socket or the readiness socket), so possession, not a uid,
// is the credential, as for the kernel socket itself. The asker gets one end
// of a socket pair whose other end the owner pumps to and from the stream,
// and a copy of the kernel TCP socket for names and options
// (docs/preload.md, "Process shapes").
#include <sys/types.h>

#include <memory>
#include <string>

namespace rdmakit::preload {

// Owner side: starts serving (once per process; a forked child starts its
// own when it upgrades something).
void ensure_relay_server();
// At exit, before the streams close, and in a forked child (the thread is
// the parent's).
void stop_relay_server();
void forget_relay_server_in_child();

// The application closed its last alias of c. A connection another process
// may still hold (one that came here by fork, exec or SCM_RIGHTS, or that
// this process copied by fork) stays open, served by the relay server, while
// another process holds it, as a kernel socket stays open until its last
// copy closes; otherwise it closes now.
struct Conn;
void release_conn(const std::shared_ptr<Conn>& c);

// Writes to a relay's wake channel, which may have been closed by its owner
// (exited): never SIGPIPE (only poll and write: a sandboxed process may
// allow no more).
ssize_t write_wake(int w, const void* buf, size_t len) noexcept;

// A relayed process shut c down for writing: the owner shuts the stream
// down once it has carried every byte written before (its relay socket's
// end of stream alone cannot tell this from a close and an exit).
void say_shutdown(Conn& c) noexcept;
// A relayed process lets go of c (its last copy closes, or it exits): what
// arrived and was never read goes back to the owner.
void give_back(Conn& c);
// This process relays connections to others.
bool any_relayed() noexcept;
// The owner reads c itself: relayed processes that are gone give back first.
void reclaim_relays(Conn& c);
// Pushes into c's stream every byte its relayed processes have written so
// far (the owner is about to write itself).
void flush_relays(Conn& c);

struct RelayGrant {
  bool granted = false;
  int relay = -1;   // the new relay socket; -1 when held_fd already is one
  int tcp = -1;     // a copy of the connection's kernel TCP socket
  int wake = -1;    // one byte written here starts delivery (the first read)
  std::string why;  // not granted: why
};
// Asker side: asks process `owner` to relay the connection held_fd names.
// The relay starts dormant: the owner carries the asker's writes at once
// but sends it nothing until a byte arrives on `wake` (the asker's first
// read), so a process that holds the connection and only writes (a forked
// helper, git's pack-objects) takes none of the bytes its owner reads.
RelayGrant request_relay(pid_t owner, int held_fd);

}  // namespace rdmakit::preload
