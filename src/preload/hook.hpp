#pragma once
// What every interposer shares (docs/preload.md, "Interception"): the
// export macros, and on_conn, the one way a hooked call on an fd finds the
// connection the library carries for it or falls through to libc.
#include <cstdint>

#include "state.hpp"

#define EXPORT extern "C" __attribute__((visibility("default")))
// The hooked call's return address: rdmakit's own code or the
// application's (fd_place.hpp). Valid only in the exported function itself.
#define CALLER __builtin_return_address(0)

namespace rdmakit::preload {

// What a hook does with the connection: kData is a use (a pending entry is
// settled first: handoff.hpp), kMeta only reads or sets the socket's
// metadata (flags, options) and leaves a pending connection pending.
enum class Use : uint8_t { kData, kMeta };

// io(Conn&) when fd names a connection this process carries, else pass()
// (the libc call). Both return the hook's result.
template <Use U = Use::kData, class Io, class Pass>
inline auto on_conn(int fd, Io&& io, Pass&& pass) -> decltype(pass()) {
  if (!is_conn(fd)) [[likely]] return pass();
  const auto c = U == Use::kData ? find_conn(fd) : meta_conn(fd);
  if (!c) return pass();
  return io(*c);
}

// A new kernel fd with this number: whatever the tables held for it was
// closed behind the library's back (fclose, a raw syscall) and is stale.
void forget_stale(int fd);

}  // namespace rdmakit::preload
