#pragma once
// Signals that arrive while the library works inside an application's call
// (docs/preload.md, "Signals"). The first use of a connection may run its
// upgrade (a rendezvous, a settle) inside the application's recv or poll.
// That work must finish whatever arrives, so the application's signals are
// held back for its length (SignalHold); any that came are then delivered,
// their handlers run, and if the application's call would go on to block
// it returns EINTR, as the kernel's would have: always for poll and
// select, and for a socket call when a handler without SA_RESTART is
// installed or the socket has a timeout (signal(7)).
#include <poll.h>
#include <signal.h>

namespace rdmakit::preload {

// poll(2) for the library's own waits: goes on through EINTR with what is
// left of timeout_ms (-1: no end), noting the signal for the caller.
int poll_through_signals(pollfd* fds, nfds_t n, int timeout_ms) noexcept;

// One application call that may upgrade a connection before it waits:
// signals noted from its start count for interrupted(). Nests: only the
// outermost decides.
class SignalWatch {
 public:
  SignalWatch() noexcept;
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

 private:
  bool outer_;
};

// Holds back, on this thread, the asynchronous signals the application
// catches while the library settles a connection (when `hold`); at the
// end, those that came are noted and delivered. Signals left to their
// default action or ignored are never held (they interrupt nothing; a
// Ctrl-C that kills is not delayed), nor synchronous ones (SIGSEGV,
// SIGBUS...: the kernel kills a thread that faults with them blocked).
class SignalHold {
 public:
  explicit SignalHold(bool hold) noexcept;
  ~SignalHold();
  SignalHold(const SignalHold&) = delete;
  SignalHold& operator=(const SignalHold&) = delete;

 private:
  bool held_ = false;
  sigset_t before_{};
};

// A signal noted in this thread's outermost watch, not yet taken.
// Initial-exec: a blocking call on an upgraded connection reads it without
// a call (the note is set only by a settle or a library wait).
extern __thread bool t_signal_noted __attribute__((tls_model("initial-exec")));

// Whether a signal that interrupted an application's blocking call ends it
// with EINTR (else the call restarts, as the kernel restarts it).
// restartable: a socket call without a timeout, which the kernel restarts
// for an SA_RESTART handler; then EINTR only if some installed handler
// lacks SA_RESTART (which signal came is not known here). poll, select and
// epoll_wait are never restarted.
bool signal_ends_call(bool restartable) noexcept;

// Whether the watched application call about to block should return EINTR
// instead: a signal was noted since the watch began and signal_ends_call.
// Takes the note (a second call says false). Outside the outermost watch:
// false.
bool interrupted(bool restartable) noexcept;
inline bool interrupted_now(bool restartable) noexcept {
  return t_signal_noted && interrupted(restartable);
}

// A read call whose settle left fd a plain socket (kernel TCP, a relay):
// whether a signal noted during the settle ends it with EINTR instead of
// the read the kernel would now make wait (fd blocking, nothing to read).
bool signal_ends_kernel_read(int fd) noexcept;

}  // namespace rdmakit::preload
