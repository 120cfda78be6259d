#pragma once
// Both ends of a loopback connection in this process: a program connected
// to its own listener (a test harness, an in-process client of an embedded
// server, a single-threaded event loop that serves itself). Each end's
// first use waits for the other end's, and this very thread may be the one
// that would make it: the end used first settles the other on a short-lived
// helper thread, so both halves of the rendezvous run at once and no first
// use waits out the budget (docs/preload.md, "Process shapes").
#include <thread>

namespace rdmakit::preload {

// The other end of fd's connection when it is a pending entry of this
// process, else -1. client: fd is the connect()ed end. Always -1 on a
// helper thread (the end that started it is being settled).
int find_mirror(int fd, bool client);

// A client end whose listener is this process: the accepted end, given
// another thread's accept() about a millisecond to return it; -1 when it
// has not (waiting longer could be waiting for this very thread).
int await_accepted_mirror(int fd);

// This thread is a helper settling the other end for the thread that
// settles this one.
bool settling_for_mirror() noexcept;

// Settles `fd` on a helper thread, joined when this is destroyed.
class MirrorSettle {
 public:
  explicit MirrorSettle(int fd);
  ~MirrorSettle();
  MirrorSettle(const MirrorSettle&) = delete;
  MirrorSettle& operator=(const MirrorSettle&) = delete;

 private:
  std::thread thread_;
};

}  // namespace rdmakit::preload
