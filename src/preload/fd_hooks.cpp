// Descriptor-creating libc calls that rdmakit code inside the process makes
// for itself (fd_place.hpp): the result moves to the high range. Called by
// the application, they pass straight through.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include <cerrno>
#include <cstdarg>

#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "hook.hpp"
#include "libc.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) {
  const int r = real().socketpair(domain, type, protocol, sv);
  if (r == 0 && !internal_caller(CALLER)) {
    if (app_fd(sv[1]) < 0) {
      real().close(sv[0]);
      return -1;
    }
    if (app_fd(sv[0]) < 0) {
      real().close(sv[1]);
      return -1;
    }
  } else if (r == 0) {
    sv[0] = place_high(sv[0]);
    sv[1] = place_high(sv[1]);
    if (sv[0] < 0 || sv[1] < 0) {  // no room above the application's numbers
      if (sv[0] >= 0) real().close(sv[0]);
      if (sv[1] >= 0) real().close(sv[1]);
      errno = EMFILE;
      return -1;
    }
  }
  return r;
}

EXPORT int eventfd(unsigned initval, int flags) {
  const int fd = real().eventfd(initval, flags);
  return internal_caller(CALLER) ? place_high(fd) : app_fd(fd);
}

EXPORT int epoll_create1(int flags) {
  const int fd = real().epoll_create1(flags);
  if (internal_caller(CALLER)) return place_high(fd);
  if (app_fd(fd) < 0) return -1;
  epoll_created(fd);  // every registration of this set passes through epoll_ctl
  return fd;
}

EXPORT int epoll_create(int size) {
  const int fd = real().epoll_create(size);
  if (internal_caller(CALLER)) return place_high(fd);
  if (app_fd(fd) < 0) return -1;
  epoll_created(fd);
  return fd;
}

EXPORT int memfd_create(const char* name, unsigned flags) {
  const int fd = real().memfd_create(name, flags);
  return internal_caller(CALLER) ? place_high(fd) : app_fd(fd);
}

EXPORT int timerfd_create(int clockid, int flags) {
  const int fd = real().timerfd_create(clockid, flags);
  return internal_caller(CALLER) ? place_high(fd) : app_fd(fd);
}

EXPORT int open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if ((flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  const int fd = real().open(path, flags, mode);
  // Not refused past the application's limit (app_fd): O_CREAT and O_TRUNC
  // have done their work by then.
  return internal_caller(CALLER) ? place_high(fd) : fd;
}
