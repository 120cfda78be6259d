#pragma once
// The real libc functions behind the intercepted names (dlsym RTLD_NEXT),
// resolved once when the library loads so the pass-through path for
// non-socket fds is a table load and an indirect call: no lock, no malloc,
// async-signal-safe.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

namespace rdmakit::preload {

struct Libc {
  int (*socket)(int, int, int);
  int (*connect)(int, const sockaddr*, socklen_t);
  int (*listen)(int, int);
  int (*accept)(int, sockaddr*, socklen_t*);
  int (*accept4)(int, sockaddr*, socklen_t*, int);
  int (*close)(int);
  int (*close_range)(unsigned, unsigned, int);
  int (*shutdown)(int, int);
  ssize_t (*read)(int, void*, size_t);
  ssize_t (*write)(int, const void*, size_t);
  ssize_t (*readv)(int, const iovec*, int);
  ssize_t (*writev)(int, const iovec*, int);
  ssize_t (*recv)(int, void*, size_t, int);
  ssize_t (*send)(int, const void*, size_t, int);
  ssize_t (*recvfrom)(int, void*, size_t, int, sockaddr*, socklen_t*);
  ssize_t (*sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t);
  ssize_t (*recvmsg)(int, msghdr*, int);
  ssize_t (*sendmsg)(int, const msghdr*, int);
  int (*sendmmsg)(int, mmsghdr*, unsigned, int);
  int (*recvmmsg)(int, mmsghdr*, unsigned, int, timespec*);
  ssize_t (*read_chk)(int, void*, size_t, size_t);
  ssize_t (*recv_chk)(int, void*, size_t, size_t, int);
  ssize_t (*recvfrom_chk)(int, void*, size_t, size_t, int, sockaddr*, socklen_t*);
  int (*fcntl)(int, int, ...);
  int (*fcntl64)(int, int, ...);
  int (*ioctl)(int, unsigned long, ...);
  int (*getsockopt)(int, int, int, void*, socklen_t*);
  int (*setsockopt)(int, int, int, const void*, socklen_t);
  int (*getsockname)(int, sockaddr*, socklen_t*);
  int (*getpeername)(int, sockaddr*, socklen_t*);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  ssize_t (*sendfile)(int, int, off_t*, size_t);
  ssize_t (*splice)(int, loff_t*, int, loff_t*, size_t, unsigned);
  ssize_t (*pread)(int, void*, size_t, off_t);
  int (*socketpair)(int, int, int, int*);
  int (*eventfd)(unsigned, int);
  int (*epoll_create1)(int);
  int (*epoll_create)(int);
  int (*memfd_create)(const char*, unsigned);
  int (*timerfd_create)(int, int);
  int (*open)(const char*, int, ...);
  int (*execve)(const char*, char* const*, char* const*);
  int (*execv)(const char*, char* const*);
  int (*execvp)(const char*, char* const*);
  int (*execvpe)(const char*, char* const*, char* const*);
  int (*fexecve)(int, char* const*, char* const*);
  int (*poll)(pollfd*, nfds_t, int);
  int (*epoll_wait)(int, epoll_event*, int, int);
  int (*select)(int, fd_set*, fd_set*, fd_set*, timeval*);
  int (*epoll_ctl)(int, int, int, epoll_event*);
  int (*ppoll)(pollfd*, nfds_t, const timespec*, const sigset_t*);
  int (*pselect)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*);
  int (*epoll_pwait)(int, epoll_event*, int, int, const sigset_t*);
  int (*epoll_pwait2)(int, epoll_event*, int, const timespec*,
                      const sigset_t*);  // or null
  int (*poll_chk)(pollfd*, nfds_t, int, size_t);
  int (*ppoll_chk)(pollfd*, nfds_t, const timespec*, const sigset_t*, size_t);
  long (*syscall)(long, ...);
};

// A system call made here, without glibc's syscall() (interposed by
// conn_hooks.cpp, and needed before dlsym can run): the result, or -1 with
// errno.
inline long raw_syscall(long n, long a1, long a2, long a3, long a4, long a5,
                        long a6) noexcept {
  long ret = 0;
#if defined(__x86_64__)
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
#elif defined(__aarch64__)
  register long x8 asm("x8") = n;
  register long x0 asm("x0") = a1;
  register long x1 asm("x1") = a2;
  register long x2 asm("x2") = a3;
  register long x3 asm("x3") = a4;
  register long x4 asm("x4") = a5;
  register long x5 asm("x5") = a6;
  asm volatile("svc 0"
               : "+r"(x0)
               : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
               : "memory", "cc");
  ret = x0;
#else
#error "raw_syscall: add this architecture's system call convention"
#endif
  if (ret < 0 && ret > -4096) {
    errno = static_cast<int>(-ret);
    return -1;
  }
  return ret;
}

// The prlimit system call itself: the limit hooks run before this table is
// resolved (a sanitizer runtime reads the limits while it starts, when
// dlsym cannot run yet). 0, or -1 with errno.
inline int sys_prlimit(pid_t pid, int resource, const rlimit* want,
                       rlimit* old) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): system call arguments
  return static_cast<int>(raw_syscall(SYS_prlimit64, pid, resource,
                                      reinterpret_cast<long>(want),
                                      reinterpret_cast<long>(old), 0, 0));
}
inline int sys_getrlimit(int resource, rlimit* lim) noexcept {
  return sys_prlimit(0, resource, nullptr, lim);
}
inline int sys_setrlimit(int resource, const rlimit* lim) noexcept {
  return sys_prlimit(0, resource, lim, nullptr);
}

// glibc's syscall() (its errno handling), or the raw call before the table
// is resolved.
long forward_syscall(long n, long a1, long a2, long a3, long a4, long a5,
                     long a6) noexcept;

// Filled by resolve_libc() (library constructor; also called by a hook that
// runs before it, e.g. from another library's constructor).
extern Libc libc;
void resolve_libc() noexcept;
inline const Libc& real() noexcept {
  if (libc.read == nullptr) resolve_libc();
  return libc;
}

}  // namespace rdmakit::preload
