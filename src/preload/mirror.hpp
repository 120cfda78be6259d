#pragma once
// Both ends of a loopback connection in this process: a program connected
// to its own listener (a test harness, an in-process client of an embedded
// server, a single-threaded event loop that serves itself). Each end's
// first use waits for the other end's, and this very thread may be the one
// that would make it: the end used first settles the other on a short-lived
// helper thread, so both halves of the rendezvous run at once and no first
// use waits out the budget (docs/preload.md, "Process shapes").
#include <cstdint>
#include <memory>
#include <thread>

#include "state.hpp"

namespace rdmakit::preload {

// The other end of a connection. pending is null when another thread is
// settling that end already (which is all the rendezvous needs).
struct Mirror {
  int fd = -1;
  std::shared_ptr<Pending> pending;
  explicit operator bool() const noexcept { return fd >= 0; }
};

// The other end of fd's connection, when it is an unsettled end this
// process made itself (accepted here, since the last fork; or connected to
// a listener of this process). client: fd is the connect()ed end. Nothing
// on a helper thread (the end that started it is being settled).
Mirror find_mirror(int fd, bool client);

// A client end whose listener is this process: its accepted end, waited
// for up to the budget when another thread accepts on that port (inside
// accept() now, or the last to call it), as for another process; else for
// about a millisecond (this thread may be the one that accepts: waiting
// longer would wait for itself). Nothing when it has not come.
Mirror await_accepted_mirror(int fd);

// Held by the accept() hook while it waits in the kernel's accept on a
// listener of this process: its clients in this process may wait for it.
class AcceptWatch {
 public:
  explicit AcceptWatch(int listen_fd) noexcept;
  ~AcceptWatch();
  AcceptWatch(const AcceptWatch&) = delete;
  AcceptWatch& operator=(const AcceptWatch&) = delete;

 private:
  uint16_t port_;
};

// This thread is a helper settling the other end for the thread that
// settles this one.
bool settling_for_mirror() noexcept;

// Settles the other end on a helper thread (signals blocked), joined when
// this is destroyed. The helper only takes an end nobody else is settling:
// whoever is, is settling it against us, which is all the rendezvous needs.
// Without a thread (none could be made) the caller goes on alone.
class MirrorSettle {
 public:
  // other.pending must be set.
  explicit MirrorSettle(Mirror other) noexcept;
  ~MirrorSettle();
  MirrorSettle(const MirrorSettle&) = delete;
  MirrorSettle& operator=(const MirrorSettle&) = delete;

 private:
  std::thread thread_;
};

}  // namespace rdmakit::preload
