#pragma once
// Descriptors the library (and the rdmakit core and streams inside it)
// creates for itself are moved to a high range, so the application's own
// fd numbers stay as small as without the preload: wrk sizes its event loop
// by connection count, select() users by FD_SETSIZE. The stream API offers
// no way to choose its descriptors' numbers, so the creating libc calls are
// interposed here and recognised by their caller's address.
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
// fd moved to the high range (close-on-exec); fd itself when no room.
int place_high(int fd) noexcept;
// The lowest fd number the high range starts at (0: no high range).
int high_base() noexcept;

}  // namespace rdmakit::preload
