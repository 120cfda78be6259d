#pragma once
// What every interposer shares (docs/preload.md, "Interception"): the
// export macros, and on_conn, the one way a hooked call on an fd finds the
// connection the library carries for it or falls through to libc.
#include <sys/uio.h>

#include <cstdint>

#include "conn_guard.hpp"
#include "early_send.hpp"
#include "interruption.hpp"
#include "state.hpp"

#define EXPORT extern "C" __attribute__((visibility("default")))
// The hooked call's return address: rdmakit's own code or the
// application's (fd_place.hpp). Valid only in the exported function itself.
#define CALLER __builtin_return_address(0)

namespace rdmakit::preload {

// What a hook does with the connection: kData is a use (a pending entry is
// settled first: handoff.hpp), kWrite a use that only sends (a dormant
// relay carries it without starting to deliver: relay.hpp), kMeta only
// reads or sets the socket's metadata (flags, options) and leaves a pending
// connection pending.
// kSend is a kWrite of bytes (write, send, writev, sendmsg): a client's
// first ones may go to kernel TCP before the upgrade (early_send.hpp).
enum class Use : uint8_t { kData, kWrite, kSend, kMeta };

// The rarely taken part of on_conn: an entry to settle first (its first
// use), one the I/O calls pass through (a listener, a relay socket), or a
// connection whose slot changed under the hook (it is looked up again,
// under the table lock).
template <Use U, class Io, class Pass>
[[gnu::noinline]] auto on_conn_slow(int fd, Io io, Pass pass, const iovec* sent,
                                    int sent_cnt) -> decltype(pass()) {
  if (!is_conn(fd)) return pass();
  // A signal during the settle below ends a call that would then block.
  const SignalWatch watch;
  if constexpr (U == Use::kSend) {
    if (EarlySend early(fd, sent, sent_cnt); early) return early.done(pass());
  }
  std::shared_ptr<Conn> c;
  {
    const SignalHold hold(settles_first(fd, U == Use::kMeta));
    c = U == Use::kMeta ? meta_conn(fd) : find_conn(fd, U == Use::kData);
  }
  if (!c) {
    if constexpr (U == Use::kData) {
      if (signal_ends_kernel_read(fd)) {
        errno = EINTR;
        return -1;
      }
    }
    return pass();
  }
  return io(*c);
}

// io(Conn&) when fd names a connection this process carries, else pass()
// (the libc call); both return the hook's result. The common cases are one
// load of the fd's table word: 0 (not tracked) goes to libc at once, an
// upgraded connection of this process to io under a ConnGuard; everything
// else is on_conn_slow. kSend: `sent` names the bytes the call sends.
template <Use U = Use::kData, class Io, class Pass>
inline auto on_conn(int fd, Io&& io, Pass&& pass, const iovec* sent = nullptr,
                    int sent_cnt = 0) -> decltype(pass()) {
  const uintptr_t w = fd_word(fd);
  if (w == 0) [[likely]]
    return pass();
  if (w >= kConnWord) [[likely]] {
    const ConnGuard guard(g_fd_word[fd], w);
    if (guard) [[likely]]
      return io(*guard);
  }
  return on_conn_slow<U>(fd, io, pass, sent, sent_cnt);
}

// A new kernel fd with this number: whatever the tables held for it was
// closed behind the library's back (fclose, a raw syscall) and is stale:
// the library lets go of it as at close().
void forget_stale(int fd);

}  // namespace rdmakit::preload
