// Connection setup and teardown (docs/preload.md, "Interception"): socket,
// connect, listen, accept, close, shutdown and the fd aliases (dup). This
// is where a TCP connection becomes an upgraded one, a pending one
// (handoff.hpp) or stays on kernel TCP, and where the fd table follows the
// kernel's descriptor numbers. No exception leaves this file: the control
// path catches everything and falls back to the kernel socket.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <string>

#include "adopt.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "hook.hpp"
#include "interruption.hpp"
#include "kernel_registrations.hpp"
#include "libc.hpp"
#include "mirror.hpp"
#include "relay.hpp"
#include "remote.hpp"
#include "rendezvous.hpp"
#include "rules.hpp"
#include "stat.hpp"
#include "state.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

// The application closes a number that is the library's (it never received
// it: a loop over every number up to the limit, say): EBADF, as for a
// number it does not hold.
int refuse_library_close(int fd) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    log_line(
        "close(%d) by the application: a descriptor of the library, which the "
        "application never received; left open (EBADF; further ones are not logged)",
        fd);
  }
  errno = EBADF;
  return -1;
}

// Part of an application's close_range or closefrom that holds no library
// descriptor.
int close_app_range(unsigned lo, unsigned hi, int flags) {
  const unsigned end = hi < static_cast<unsigned>(kMaxFd) ? hi : kMaxFd - 1;
  for (unsigned fd = lo; fd <= end && fd < static_cast<unsigned>(kMaxFd); ++fd) {
    forget_stale(static_cast<int>(fd));
  }
  return real().close_range(lo, hi, flags);
}

}  // namespace

namespace {

// The library lets go of what it holds for fd, as the application lets go
// of the number: by close() (close_number), or behind the library's back
// (a system call the hooks do not see), found when the number comes back
// (forget_stale).
int let_go(int fd, bool close_number) {
  forget_kernel_registrations(fd);
  if (is_conn(fd) || entry_of(fd) == Entry::kRelayed) {
    // A connect()ed pending connection withdraws its offer after its kernel
    // socket closed: a server that takes the offer up meanwhile sees the end
    // of stream too (a client that closed before using the connection).
    std::shared_ptr<Pending> pending = pending_of(fd);
    auto c = remove_conn(fd);
    if (c && !c->stream && c.use_count() == 1) give_back(*c);  // its last relayed copy
    const int r = close_number ? real().close(fd) : 0;
    const int saved = errno;
    // Last alias: the stream closes (queued data still delivered), unless
    // another process still holds the connection (relay.hpp).
    release_conn(c);
    c.reset();
    pending.reset();
    errno = saved;
    return r;
  }
  if (is_listener(fd)) remove_listener(fd);
  forget_epoll(fd);
  stats::forget_fd(fd);
  return close_number ? real().close(fd) : 0;
}

}  // namespace

void rdmakit::preload::forget_stale(int fd) { (void)let_go(fd, false); }

namespace {

bool tcp_stream_socket(int fd) {
  int type = 0;
  int proto = 0;
  socklen_t l = sizeof type;
  if (real().getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0 || type != SOCK_STREAM) {
    return false;
  }
  l = sizeof proto;
  return real().getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 &&
         proto == IPPROTO_TCP;
}

bool inet(const sockaddr* sa) {
  return sa != nullptr && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6);
}

uint16_t port_of(const sockaddr* sa) {
  return ntohs(sa->sa_family == AF_INET
                   ? reinterpret_cast<const sockaddr_in*>(sa)->sin_port      // NOLINT
                   : reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);  // NOLINT
}

// Whether this process may upgrade anything ("" yes); bad rule variables
// are reported once.
const std::string& process_rules() {
  static bool reported = false;
  if (!reported) {
    reported = true;
    if (!rule_errors().empty()) log_line("config: %s", rule_errors().c_str());
  }
  return process_denied();
}

void finish_upgrade(PendingOfferPtr offer, int fd) {
  const std::string where = describe(fd);
  Upgrade up = finish_connect(std::move(offer), fd);
  if (up.stream == nullptr) {
    log_line("connect fd=%d %s path=kernel reason=%s", fd, where.c_str(),
             up.reason.c_str());
    publish_fallback(fd, "connect", up.reason);
    return;
  }
  (void)adopt(fd, {fd}, up, "connect", where);
}
}  // namespace

EXPORT int socket(int domain, int type, int protocol) {
  int fd = real().socket(domain, type, protocol);
  fd = internal_caller(CALLER) ? place_high(fd) : app_fd(fd);
  if (fd >= 0) forget_stale(fd);
  return fd;
}

EXPORT int connect(int fd, const sockaddr* addr, socklen_t len) {
  // A connection already made (a second connect() asks whether a
  // non-blocking one is done, as hiredis does): the kernel socket answers.
  if (entry_of(fd) != Entry::kNone && entry_of(fd) != Entry::kListener) {
    return real().connect(kernel_socket(fd), addr, len);
  }
  // rdmakit's own connections (the tcp provider) are not candidates.
  if (!inet(addr) || fd >= kMaxFd || internal_caller(CALLER) || !tcp_stream_socket(fd)) {
    return real().connect(fd, addr, len);
  }
  std::string reason = process_rules();
  if (reason.empty()) reason = connection_denied(port_of(addr), addr);
  PendingOfferPtr offer;
  if (reason.empty()) offer = prepare_connect(fd, addr, &reason);
  if (!offer) {
    const int r = real().connect(fd, addr, len);
    if (r == 0 || errno == EINPROGRESS) {
      const int saved = errno;
      log_line("connect fd=%d peer=%s path=kernel reason=%s", fd, endpoint(addr).c_str(),
               reason.c_str());
      publish_fallback(fd, "connect", reason, addr);
      errno = saved;
    }
    return r;
  }
  const int r = real().connect(fd, addr, len);
  if (r != 0 && errno != EINPROGRESS) return r;
  // Same host: the rendezvous finishes at the connection's first use
  // (handoff.hpp), so this call returns as the kernel's did.
  if (const int saved = errno; !offer_is_remote(*offer) && defer_connect(fd, offer)) {
    errno = saved;
    return r;
  }
  if (r == 0) {
    finish_upgrade(std::move(offer), fd);
    return 0;
  }
  // Non-blocking connect: the upgrade must finish before the application
  // can register the fd with epoll, so wait (bounded) for the kernel
  // connect; if it takes longer the connection stays on kernel TCP.
  const int saved = errno;
  pollfd p{fd, POLLOUT, 0};
  const int pr = poll_through_signals(&p, 1, static_cast<int>(config().timeout.count()));
  if (pr <= 0) {
    log_line(
        "connect fd=%d peer=%s path=kernel reason=non-blocking connect still in progress",
        fd, endpoint(addr).c_str());
    publish_fallback(fd, "connect", "non-blocking connect still in progress", addr);
    errno = saved;
    return -1;
  }
  int err = 0;
  socklen_t el = sizeof err;
  (void)real().getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
  if (err != 0) {
    errno = err;
    return -1;
  }
  finish_upgrade(std::move(offer), fd);
  return 0;
}

EXPORT int listen(int fd, int backlog) {
  const int r = real().listen(fd, backlog);
  if (r == 0 && fd < kMaxFd && !internal_caller(CALLER) && process_rules().empty() &&
      tcp_stream_socket(fd)) {
    sockaddr_storage ss{};
    socklen_t l = sizeof ss;
    const auto* sa = reinterpret_cast<sockaddr*>(&ss);  // NOLINT
    // A port the rules deny is not registered: clients do not offer.
    if (real().getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) == 0 &&  // NOLINT
        inet(sa) && connection_denied(port_of(sa), nullptr).empty()) {
      const uint16_t port = port_of(sa);
      add_listener(fd, port);
      register_listener(port);
      open_remote_listener(fd, port);
    }
  }
  return r;
}

namespace {
int accept_hook(int fd, sockaddr* addr, socklen_t* len, int flags, const void* caller) {
  if (internal_caller(caller)) {  // rdmakit's own (shm handshake)
    const int s = place_high(real().accept4(fd, addr, len, flags));
    if (s >= 0) forget_stale(s);
    return s;
  }
  // Until the accepted end is in the table: a client of this process may
  // wait for it (mirror.hpp).
  const AcceptWatch watch(fd);
  // Not refused past the application's limit (app_fd): the connection would
  // leave the backlog and be reset; a number above it is the lesser harm.
  const int s = real().accept4(fd, addr, len, flags);
  if (s < 0) return s;
  forget_stale(s);
  // Every accepted TCP connection looks for an offer, not only those of
  // listeners registered here: a listener inherited across exec (nginx
  // binary upgrade) is not in the table, but its port may still be
  // registered, and its clients are waiting.
  if (s >= kMaxFd || !tcp_stream_socket(s)) return s;
  const int saved = errno;
  // Same host: decided at the connection's first use, in whichever process
  // makes it (handoff.hpp).
  if (defer_accepted(s)) {
    errno = saved;
    return s;
  }
  const std::string where = describe(s);
  std::string deny = process_rules();
  if (deny.empty()) {
    sockaddr_storage local{};
    sockaddr_storage peer{};
    socklen_t ll = sizeof local;
    socklen_t pl = sizeof peer;
    if (real().getsockname(s, reinterpret_cast<sockaddr*>(&local), &ll) == 0 &&  // NOLINT
        real().getpeername(s, reinterpret_cast<sockaddr*>(&peer), &pl) == 0) {   // NOLINT
      deny = connection_denied(port_of(reinterpret_cast<sockaddr*>(&local)),     // NOLINT
                               reinterpret_cast<sockaddr*>(&peer));              // NOLINT
    }
  }
  Upgrade up = upgrade_accepted(s, deny);
  if (up.stream == nullptr) {
    log_line("accept fd=%d %s path=kernel reason=%s", s, where.c_str(),
             up.reason.c_str());
    publish_fallback(s, "accept", up.reason);
  } else {
    (void)adopt(s, {s}, up, "accept", where);
  }
  errno = saved;
  return s;
}
}  // namespace

EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return accept_hook(fd, addr, len, flags, CALLER);
}

EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) {
  return accept_hook(fd, addr, len, 0, CALLER);
}

namespace {

int close_from(int fd, const void* caller) {
  if (library_fd(fd) && !internal_caller(caller)) return refuse_library_close(fd);
  settle_before_close(fd);
  return let_go(fd, true);
}

int close_range_from(unsigned first, unsigned last, int flags, const void* caller) {
  if (internal_caller(caller) || (flags & CLOSE_RANGE_CLOEXEC) != 0 || first > last) {
    return real().close_range(first, last, flags);
  }
  return for_each_app_range(first, last, close_app_range, flags);
}

}  // namespace

EXPORT int close(int fd) { return close_from(fd, CALLER); }

EXPORT int close_range(unsigned first, unsigned last, int flags) {
  return close_range_from(first, last, flags, CALLER);
}

// libuv (node) closes with syscall(SYS_close, fd), to avoid a cancellation
// point: those closes are the application's too. Every other number goes
// to the kernel unchanged. Six arguments are read whatever the caller
// passed, as glibc's syscall() reads them: past the caller's own arguments
// that is its stack frame, which AddressSanitizer would report.
EXPORT __attribute__((no_sanitize_address)) long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);  // as many as any system call takes
  va_end(ap);
  if (number == SYS_close) return close_from(static_cast<int>(a[0]), CALLER);
  if (number == SYS_close_range) {
    return close_range_from(static_cast<unsigned>(a[0]), static_cast<unsigned>(a[1]),
                            static_cast<int>(a[2]), CALLER);
  }
  return forward_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

// glibc's closefrom calls the system call itself: interposed, so that it
// leaves the library's descriptors alone too.
EXPORT void closefrom(int lowfd) {
  if (for_each_app_range(lowfd < 0 ? 0 : static_cast<unsigned>(lowfd), ~0U,
                         close_app_range, 0) != 0) {
    // No close_range (an old kernel): one number at a time, up to the
    // application's limit (the library's descriptors are above it).
    for (int fd = lowfd; fd < sysconf(_SC_OPEN_MAX); ++fd) {
      if (!library_fd(fd)) (void)close(fd);
    }
  }
}

EXPORT int shutdown(int fd, int how) {
  // A relayed copy's shutdown is the connection's, as on kernel TCP: its
  // owner is told before the relay socket's end of stream.
  if (how != SHUT_RD) {
    const Entry e = entry_of(fd);
    if (e == Entry::kRelayed || e == Entry::kDormant) {
      if (auto c = entry_conn(fd)) say_shutdown(*c);
    }
  }
  // A shutdown is no read: it never starts a dormant relay's delivery.
  return on_conn<Use::kWrite>(
      fd,
      [=](Conn& c) {
        // What relayed processes wrote before this call goes before the
        // end of stream (a CGI child that wrote its answer and exited).
        if (how != SHUT_RD && c.relays() > 0) flush_relays(c);
        const int r = c.stream->shutdown(how);
        if (r < 0) {
          errno = -r;
          return -1;
        }
        return 0;
      },
      [=] { return real().shutdown(fd, how); });
}

EXPORT int dup(int fd) {
  const int r = internal_caller(CALLER) ? real().dup(fd) : app_fd(real().dup(fd));
  if (r < 0) return r;
  forget_stale(r);
  epoll_seen_by_kernel(fd);  // an epoll set now also answers under another number
  copy_entry(fd, r);
  return r;
}

EXPORT int dup3(int oldfd, int newfd, int flags) {
  if (!app_number(newfd) && !internal_caller(CALLER)) {
    errno = EBADF;  // as the application's own limit has it
    return -1;
  }
  const int r = real().dup3(oldfd, newfd, flags);
  if (r < 0) return r;
  // newfd was closed by the kernel: the library lets go of what it was, as at
  // its close(), and keeps the old alias.
  forget_stale(newfd);
  epoll_seen_by_kernel(oldfd);  // an epoll set now also answers under another number
  copy_entry(oldfd, newfd);
  return r;
}

EXPORT int dup2(int oldfd, int newfd) {
  if (oldfd == newfd) return real().dup2(oldfd, newfd);
  if (!app_number(newfd) && !internal_caller(CALLER)) {
    errno = EBADF;
    return -1;
  }
  const int r = dup3(oldfd, newfd, 0);
  if (r < 0 && errno == EINVAL) return real().dup2(oldfd, newfd);
  return r;
}
