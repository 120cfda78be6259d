#pragma once
// Every thread rdmakit starts (progress threads, acceptors, the preload's
// helpers) runs with the application's asynchronous signals blocked. A
// process-directed signal then goes to one of the application's own
// threads, where its handler belongs and where it interrupts the blocking
// call the application expects it to (signal(7)). Synchronous signals
// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay deliverable: the
// kernel kills a thread that faults with them blocked, and sanitizers
// report through their handlers.
#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace rdmakit::detail {

inline sigset_t asynchronous_signals() noexcept {
  sigset_t s;
  sigfillset(&s);
  for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS})
    sigdelset(&s, sig);
  return s;
}

// std::thread(f), started with asynchronous_signals() blocked: the new
// thread inherits the mask from its first instruction (blocking from inside
// it would leave a window). The caller's mask is as it was on return.
template <class F>
std::thread start_library_thread(F&& f) {
  const sigset_t blocked = asynchronous_signals();
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, &blocked, &before);
  struct Restore {
    const sigset_t* mask;
    ~Restore() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } restore{&before};
  return std::thread(std::forward<F>(f));
}

}  // namespace rdmakit::detail
