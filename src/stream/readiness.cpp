#include "stream/readiness.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace rdmakit::stream::detail {

namespace {
// Larger than a quarter of the smallest send buffer the kernel allows
// (SOCK_MIN_SNDBUF, about 4.5 KiB) and below that buffer minus 32.
constexpr size_t kBlockerSize = 2048;
}  // namespace

Readiness::~Readiness() { close(); }

void Readiness::close() noexcept {
  if (user_ >= 0) ::close(user_);
  if (ours_ >= 0) ::close(ours_);
  user_ = ours_ = -1;
}

void Readiness::set_ended(bool rdhup, bool hup, bool error) noexcept {
  if (user_ < 0) return;
  if (error && !error_) {
    // The kernel sets ECONNRESET on the user end when its peer (our end)
    // disconnects with the user end's datagrams unread (unix_dgram_disconnected).
    const char byte = 0;
    (void)::send(user_, &byte, 1, MSG_DONTWAIT);
    sockaddr unspec{};
    unspec.sa_family = AF_UNSPEC;
    (void)::connect(ours_, &unspec, sizeof unspec);
    error_ = true;
    writable_ = true;  // the disconnect dropped the blocker, if one was queued
  }
  if (hup && !hup_) {
    (void)::shutdown(user_, SHUT_RDWR);
    hup_ = rdhup_ = readable_ = true;
  } else if (rdhup && !rdhup_) {
    (void)::shutdown(user_, SHUT_RD);
    rdhup_ = readable_ = true;
  }
}

void Readiness::clear_error() noexcept {
  if (user_ < 0 || !error_) return;
  int err = 0;
  socklen_t len = sizeof err;
  (void)::getsockopt(user_, SOL_SOCKET, SO_ERROR, &err, &len);
}

int Readiness::open() noexcept {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0)
    return -errno;
  const int tiny = 1;  // the kernel rounds up to its minimum
  if (::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &tiny, sizeof tiny) != 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return -err;
  }
  user_ = fds[0];
  ours_ = fds[1];
  return 0;
}

void Readiness::set(bool readable, bool writable) noexcept {
  if (user_ < 0) return;
  // After the end of stream the user end is readable for good (its
  // shutdown): no datagram to add or take.
  if (readable != readable_ && !rdhup_) {
    if (readable) {
      const char byte = 1;
      (void)::send(ours_, &byte, 1, MSG_DONTWAIT);
    } else {
      // readable_ says our one datagram is queued: one recv takes it (a
      // loop would pay a second, failing, recv on every transition).
      char drain[16];
      (void)::recv(user_, drain, sizeof drain, MSG_DONTWAIT);
    }
    readable_ = readable;
  }
  if (writable != writable_) {
    if (!writable) {
      static const char blocker[kBlockerSize] = {};
      (void)::send(user_, blocker, sizeof blocker, MSG_DONTWAIT);
    } else {
      static char drain[kBlockerSize];
      (void)::recv(ours_, drain, sizeof drain, MSG_DONTWAIT);  // the one blocker
    }
    writable_ = writable;
  }
}

}  // namespace rdmakit::stream::detail
