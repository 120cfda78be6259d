#include "adopt.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "conn_guard.hpp"
#include "fd_place.hpp"
#include "kernel_registrations.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "stat.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

stats::Side side_of(const char* side) {
  return std::strcmp(side, "accept") == 0 ? stats::kSideAccept : stats::kSideConnect;
}

}  // namespace

Ends ends_of(int fd) {
  sockaddr_storage l{};
  sockaddr_storage p{};
  socklen_t ll = sizeof l;
  socklen_t pl = sizeof p;
  (void)real().getsockname(fd, reinterpret_cast<sockaddr*>(&l), &ll);  // NOLINT
  (void)real().getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl);  // NOLINT
  return {endpoint(reinterpret_cast<sockaddr*>(&l)),                   // NOLINT
          endpoint(reinterpret_cast<sockaddr*>(&p))};                  // NOLINT
}

std::string describe(int fd) {
  const Ends e = ends_of(fd);
  return "local=" + e.local + " peer=" + e.peer;
}

void publish_fallback(int fd, const char* side, const std::string& reason,
                      const sockaddr* peer) {
  count_path(false);
  Ends e = ends_of(fd);
  if (peer != nullptr && e.peer == "?") e.peer = endpoint(peer);
  stats::Decision d;
  d.fd = fd;
  d.side = side_of(side);
  d.path = stats::kPathKernel;
  d.local = std::move(e.local);
  d.peer = std::move(e.peer);
  d.reason = reason.c_str();
  stats::note_fallback(d);
}

bool adopt(int fd, const std::vector<int>& aliases, Upgrade& up, const char* side,
           const std::string& where, const std::string& marker) {
  const int fl_flags = real().fcntl(fd, F_GETFL);
  // Above the application's numbers (fd_place.hpp), in the fd table.
  const int tcp = real().fcntl(fd, F_DUPFD_CLOEXEC, high_base());
  own_library_fd(tcp);
  const int ready = up.stream->fd();
  if (tcp < 0 || ready < 0 || tcp >= kMaxFd) {
    if (tcp >= 0) real().close(tcp);
    log_line("%s fd=%d %s path=kernel reason=no descriptor for the readiness mirror",
             side, fd, where.c_str());
    publish_fallback(fd, side, "no descriptor for the readiness mirror");
    return false;  // the stream is dropped before any byte; the peer sees a reset stream
  }
  // Registrations made on the kernel socket move with the numbers.
  struct stat kernel {};
  std::vector<KernelRegistration> regs;
  if (::fstat(fd, &kernel) == 0) regs = take_kernel_registrations(aliases, kernel.st_ino);
  for (const int alias : aliases) {
    const int fd_flags = real().fcntl(alias, F_GETFD);
    if (real().dup3(ready, alias, (fd_flags & FD_CLOEXEC) != 0 ? O_CLOEXEC : 0) < 0) {
      // Numbers already switched keep the readiness socket; none saw a byte.
      for (const int done : aliases) {
        if (done == alias) break;
        (void)real().dup3(tcp, done, 0);
      }
      put_back_registrations(regs);  // on the kernel socket again
      real().close(tcp);
      const std::string why = std::string("dup3: ") + std::strerror(errno);
      log_line("%s fd=%d %s path=kernel reason=%s", side, fd, where.c_str(), why.c_str());
      publish_fallback(fd, side, why);
      return false;
    }
  }
  // Before the numbers name the connection: from then on an epoll_ctl on
  // them takes the connection's path and finds these in place.
  put_back_registrations(regs);
  for (const int alias : aliases) forget_kernel_registrations(alias);
  auto conn = make_conn();
  conn->stream = std::move(up.stream);
  conn->tcp_fd = tcp;
  conn->owner = process_id();
  conn->nonblocking = (fl_flags & O_NONBLOCK) != 0;
  conn->remote = std::strcmp(up.path, "shm") != 0;
  conn->marker = marker;
  conn->adopt_gen = fork_generation();
  {
    stats::Decision d;
    d.fd = fd;
    d.side = side_of(side);
    d.path = !conn->remote                        ? stats::kPathShm
             : std::strcmp(up.path, "verbs") == 0 ? stats::kPathVerbs
                                                  : stats::kPathTcp;
    Ends e = ends_of(tcp);
    d.local = std::move(e.local);
    d.peer = std::move(e.peer);
    d.ring_bytes = conn->remote ? config().remote_ring_bytes : config().shm_ring_bytes;
    conn->stat_slot = stats::claim_upgraded(d);
  }
  for (const int alias : aliases) install_conn(alias, conn);
  // Another process may come to hold this connection (fork, exec,
  // SCM_RIGHTS): it asks this one to relay it.
  ensure_relay_server();
  log_line("%s fd=%d %s path=%s", side, fd, where.c_str(), up.path);
  count_path(true, std::strcmp(up.path, "shm") != 0);
  return true;
}

}  // namespace rdmakit::preload
