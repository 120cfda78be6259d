#include "relay.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fd_place.hpp"
#include "libc.hpp"
#include "relay_wire.hpp"
#include "state.hpp"

// The asking side of relays (relay.hpp): a process that holds a copy of
// another process's connection asks for a relay, and gives back what it
// never read when it lets go.
namespace rdmakit::preload {

using namespace relay_wire;  // NOLINT(google-build-using-namespace)

ssize_t write_wake(int w, const void* buf, size_t len) noexcept {
  pollfd p{w, POLLOUT, 0};
  if (real().poll(&p, 1, 0) != 1 || (p.revents & (POLLHUP | POLLERR)) != 0) {
    errno = EPIPE;
    return -1;
  }
  return real().write(w, buf, len);
}

void say_shutdown(Conn& c) noexcept {
  if (const int w = c.wake_fd.load(); w >= 0) (void)write_wake(w, "h", 1);
}

void give_back(Conn& c) {
  const int w = c.wake_fd.exchange(-1);
  if (c.relay_fd >= 0 && w >= 0) {
    // Only read, write and poll: a sandboxed process may allow no more.
    // The owner stops sending first (and says so), so what is unread here
    // is all it sent.
    if (write_wake(w, "S", 1) == 1) {
      pollfd p{w, POLLIN, 0};
      char ack = 0;
      if (real().poll(&p, 1, kStopWaitMs) == 1) (void)real().read(w, &ack, 1);
    }
    // The owner keeps what it sent last; it only needs how much of it
    // stayed unread (so the count is all an asker can say, never the bytes).
    uint64_t unread = 0;
    char buf[16384];
    for (;;) {
      pollfd p{c.relay_fd, POLLIN, 0};
      if (real().poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) break;
      const ssize_t n = real().read(c.relay_fd, buf, sizeof buf);
      if (n <= 0) break;
      unread += static_cast<uint64_t>(n);
    }
    if (unread > 0) {
      char msg[1 + sizeof unread];
      msg[0] = 'G';
      std::memcpy(msg + 1, &unread, sizeof unread);
      (void)write_wake(w, msg, sizeof msg);
    }
  }
  if (w >= 0) real().close(w);
  if (c.relay_fd >= 0) real().close(c.relay_fd);
  c.relay_fd = -1;
}

RelayGrant request_relay(pid_t owner, int held_fd) {
  RelayGrant g;
  const InternalScope internal;
  const int s = place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s < 0) {
    g.why = std::string("relay socket: ") + std::strerror(errno);
    return g;
  }
  socklen_t len = 0;
  const sockaddr_un sa = relay_address(owner, &len);
  if (real().connect(s, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {  // NOLINT
    g.why = "pid " + std::to_string(owner) + " serves no relays (" +
            std::strerror(errno) + ")";
    real().close(s);
    return g;
  }
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (real().getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
      cred.pid != owner) {
    g.why = "relay socket of pid " + std::to_string(owner) + " is served by pid " +
            std::to_string(cred.pid) + ": refused";
    real().close(s);
    return g;
  }
  Message m;
  m.status = kDormant;
  Message reply;
  int fds[2] = {-1, -1};
  if (!send_message(s, m, &held_fd, 1) ||
      !recv_message(s, &reply, fds, 2, kReplyWaitMs)) {
    g.why = "pid " + std::to_string(owner) + " did not answer the relay request";
  } else if (reply.status == kNewRelay && fds[0] >= 0 && fds[1] >= 0) {
    g.granted = true;
    g.relay = fds[0];
    g.tcp = fds[1];
    g.wake = s;  // kept: the wake and give-back channel
    return g;
  } else if (reply.status == kAlreadyRelayed && fds[0] >= 0) {
    g.granted = true;
    g.tcp = fds[0];
    g.wake = s;
    return g;
  } else {
    g.why = reply.status == kFull
                ? "pid " + std::to_string(owner) + " relays too many connections"
                : "not a connection of pid " + std::to_string(owner);
  }
  for (const int fd : fds) {
    if (fd >= 0) real().close(fd);
  }
  real().close(s);
  return g;
}

}  // namespace rdmakit::preload
