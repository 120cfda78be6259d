#pragma once
// Process lifecycle: the pid (kept current across fork without a syscall
// per call), the program name, the lazily created stream engine, fork
// handlers and the exit flush.
#include <sys/types.h>

#include <shared_mutex>
#include <string>

#include "rdmakit/stream/stream.hpp"

namespace rdmakit::preload {

pid_t process_id() noexcept;
// The library's own threads (the answerer, the relay server) hold this,
// shared, while they work and let go of it while they wait in the kernel;
// fork() takes it first, exclusively. So a child never inherits one of them
// in the middle of anything: a settle half done (a settle lock held by a
// thread the child does not have) or an allocation (AddressSanitizer's
// allocator is not locked around fork).
std::shared_mutex& fork_guard() noexcept;
const char* program_name() noexcept;
// The program's name when the library loaded (nginx later rewrites its
// argv, and so program_name(), to "nginx: worker process").
const char* launch_name() noexcept;
// An engine on `kind` (shm, or the cross-host provider) with room for a
// stream, created on first use; nullptr with *why set if it cannot be created (logged by
// the caller as the fallback reason).
stream::Engine* engine(std::string* why, ProviderKind kind = ProviderKind::kShm);
// The shm engine for connections with processes of uid `peer`: engine()
// for our own uid, else one that admits exactly that uid.
stream::Engine* engine_for_user(uid_t peer, std::string* why);
// An engine holds 1,024 streams; past that the functions above open
// another (no per-process cap). A rendezvous that will start a stream on
// `e` later (a client's offer, from connect() to its first use) counts
// itself with +1 and -1, so that the next engine opens in time.
void reserve_stream(stream::Engine* e, int delta) noexcept;

}  // namespace rdmakit::preload
