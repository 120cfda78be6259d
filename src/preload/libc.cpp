#include "libc.hpp"

#include <dlfcn.h>

#include "fd_place.hpp"

namespace rdmakit::preload {

Libc libc{};

namespace {

int (*g_libc_close)(int) = nullptr;

// Every close the library makes itself: the number is no longer its own.
int close_own(int fd) {
  forget_library_fd(fd);
  return g_libc_close(fd);
}

template <typename F>
void bind(F*& slot, const char* name) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym returns void*
  slot = reinterpret_cast<F*>(dlsym(RTLD_NEXT, name));
}
}  // namespace

void resolve_libc() noexcept {
  Libc l{};
  bind(l.socket, "socket");
  bind(l.connect, "connect");
  bind(l.listen, "listen");
  bind(l.accept, "accept");
  bind(l.accept4, "accept4");
  bind(g_libc_close, "close");
  l.close = g_libc_close != nullptr ? &close_own : nullptr;
  bind(l.close_range, "close_range");
  bind(l.shutdown, "shutdown");
  bind(l.write, "write");
  bind(l.readv, "readv");
  bind(l.writev, "writev");
  bind(l.recv, "recv");
  bind(l.send, "send");
  bind(l.recvfrom, "recvfrom");
  bind(l.sendto, "sendto");
  bind(l.recvmsg, "recvmsg");
  bind(l.sendmsg, "sendmsg");
  bind(l.sendmmsg, "sendmmsg");
  bind(l.recvmmsg, "recvmmsg");
  bind(l.read_chk, "__read_chk");
  bind(l.recv_chk, "__recv_chk");
  bind(l.recvfrom_chk, "__recvfrom_chk");
  bind(l.fcntl, "fcntl");
  // Programs built against glibc 2.28+ with 64-bit off_t call fcntl64.
  bind(l.fcntl64, "fcntl64");
  if (l.fcntl64 == nullptr) l.fcntl64 = l.fcntl;
  bind(l.ioctl, "ioctl");
  bind(l.getsockopt, "getsockopt");
  bind(l.setsockopt, "setsockopt");
  bind(l.getsockname, "getsockname");
  bind(l.getpeername, "getpeername");
  bind(l.dup, "dup");
  bind(l.dup2, "dup2");
  bind(l.dup3, "dup3");
  bind(l.sendfile, "sendfile");
  bind(l.splice, "splice");
  bind(l.pread, "pread");
  bind(l.socketpair, "socketpair");
  bind(l.eventfd, "eventfd");
  bind(l.epoll_create1, "epoll_create1");
  bind(l.epoll_create, "epoll_create");
  bind(l.memfd_create, "memfd_create");
  bind(l.timerfd_create, "timerfd_create");
  bind(l.open, "open");
  bind(l.execve, "execve");
  bind(l.execv, "execv");
  bind(l.execvp, "execvp");
  bind(l.execvpe, "execvpe");
  bind(l.fexecve, "fexecve");
  bind(l.poll, "poll");
  bind(l.syscall, "syscall");
  bind(l.epoll_wait, "epoll_wait");
  bind(l.select, "select");
  bind(l.epoll_ctl, "epoll_ctl");
  bind(l.ppoll, "ppoll");
  bind(l.pselect, "pselect");
  bind(l.epoll_pwait, "epoll_pwait");
  bind(l.epoll_pwait2, "epoll_pwait2");
  bind(l.poll_chk, "__poll_chk");
  bind(l.ppoll_chk, "__ppoll_chk");
  bind(l.read, "read");  // last: real() treats a set read as "resolved"
  libc = l;
}

long forward_syscall(long n, long a1, long a2, long a3, long a4, long a5,
                     long a6) noexcept {
  if (libc.syscall == nullptr) return raw_syscall(n, a1, a2, a3, a4, a5, a6);
  return libc.syscall(n, a1, a2, a3, a4, a5, a6);
}

}  // namespace rdmakit::preload
