#pragma once
// Descriptors the library (and the rdmakit core and streams inside it)
// creates for itself are moved to a high range, so the application's own
// fd numbers stay as small as without the preload: wrk sizes its event loop
// by connection count, select() users by FD_SETSIZE. The stream API offers
// no way to choose its descriptors' numbers, so the creating libc calls are
// interposed here and recognised by their caller's address.
#include <sys/resource.h>

namespace rdmakit::preload {

// Finds the address ranges of the library and of librdmakit (load time).
void find_own_code() noexcept;
// Whether a return address lies in rdmakit code, or the calling thread is
// inside an InternalScope.
bool internal_caller(const void* ret) noexcept;
// Marks the library's own calls into the stream API on this thread: with a
// sanitizer runtime preloaded first, every libc call reaches the hooks
// through its interceptors, so the return address no longer tells whose
// call it is (the tcp provider's sockets would look like the application's).
class InternalScope {
 public:
  InternalScope() noexcept;
  ~InternalScope();
  InternalScope(const InternalScope&) = delete;
  InternalScope& operator=(const InternalScope&) = delete;
};
// The stream engine's progress thread marks itself (EngineOptions::
// on_thread_start): every hook it reaches goes straight to libc, and no
// hook ever calls back into the engine from it. The return address cannot
// tell (with a sanitizer runtime preloaded first it is the interceptor's).
void mark_engine_thread() noexcept;
bool engine_thread() noexcept;
// fd moved to the high range (close-on-exec). With no room there it is
// closed and -1 returned (EMFILE): the numbers below belong to the
// application, so the library's call fails and its connection stays on
// kernel TCP. fd itself when there is no high range (a limit of 128 or less).
int place_high(int fd) noexcept;
// The lowest fd number the high range starts at (0: no high range).
int high_base() noexcept;

// The library's own descriptors: those place_high put in the high range,
// until the library closes them (real().close forgets them). The
// application never received their numbers, so its close, close_range and
// closefrom leave them alone, as if they were another process's (a daemon
// that closes every descriptor it does not know would otherwise cut its
// own upgraded connections).
bool library_fd(int fd) noexcept;
void forget_library_fd(int fd) noexcept;
// fd, which the library placed itself in the high range, is its own.
void own_library_fd(int fd) noexcept;
// A forked child: the descriptors it inherited are copies the application
// may close (its own library makes new ones).
void forget_all_library_fds() noexcept;
// Calls close_gap(lo, hi) for each maximal part of [first, last] that holds
// no library descriptor, lowest first; stops at the first nonzero result
// and returns it.
int for_each_app_range(unsigned first, unsigned last,
                       int (*close_gap)(unsigned lo, unsigned hi, int flags), int flags);

// A descriptor the application's own call created: past the application's
// soft limit (the library's room) it is closed and -1 returned (EMFILE), as
// the kernel would have refused it; select() users count on that.
int app_fd(int fd) noexcept;
// Whether fd is a number the application's limit allows (dup2 targets).
bool app_number(int fd) noexcept;

// The descriptor limit (docs/preload.md, "Descriptors"). The application
// keeps the soft RLIMIT_NOFILE it was started with or set, and sees it; the
// real soft limit is raised within the hard one so that the library's
// descriptors live above the application's numbers instead of taking them.
// At load (at_load: also tells preloaded children the application's limit
// through the environment), and again after an exec that failed.
void reserve_fd_room(bool at_load = true) noexcept;
// Set once reserve_fd_room() has run at load: before that (a sanitizer
// runtime sets its limits while it starts, before this library's code may
// run) the limit hooks pass straight to the system call.
extern bool g_fd_limits_ready;
// Before an exec: the real soft limit back to the application's, which the
// new image inherits.
void restore_app_fd_limit() noexcept;
// getrlimit/prlimit of RLIMIT_NOFILE for this process: the real limit with
// the application's soft limit shown.
void show_app_fd_limit(rlimit* lim) noexcept;
// setrlimit/prlimit of RLIMIT_NOFILE for this process: the application's
// new limit, with room above it. 0, or -1 with errno.
int set_app_fd_limit(const rlimit& want) noexcept;

}  // namespace rdmakit::preload
