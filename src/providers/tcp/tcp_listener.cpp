#include "providers/tcp/tcp_listener.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/address.hpp"
#include "core/deadline.hpp"
#include "core/fd.hpp"
#include "core/log.hpp"
#include "core/provider_factories.hpp"
#include "providers/tcp/tcp_cq.hpp"
#include "providers/tcp/tcp_handshake.hpp"
#include "providers/tcp/tcp_qp.hpp"
#include "providers/tcp/tcp_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

using core::Clock;
using core::ms_left;

namespace {

// Reads what has arrived of a pending client's handshake without blocking.
// Returns 0 when complete, EAGAIN when more is needed, else an error (why).
int read_handshake_step(PendingHandshake& p, const char** why) {
  for (;;) {
    size_t want = kHeaderSize;
    if (p.got >= kHeaderSize) {
      uint32_t len;
      std::memcpy(&len, p.buf.data() + 4, sizeof len);
      len = core::to_little(len);
      if (p.buf[0] != static_cast<std::byte>(WireOp::kHello) || len < kHelloBodySize ||
          len > kHelloBodySize + Context::kMaxPrivateData) {
        *why = "peer is not an rdmakit tcp endpoint (bad handshake)";
        return EPROTO;
      }
      want = kHeaderSize + len;
    }
    if (p.got == want) {
      if (want > kHeaderSize) return 0;
      continue;  // header complete: now the body
    }
    const ssize_t r =
        ::recv(p.fd.get(), p.buf.data() + p.got, want - p.got, MSG_DONTWAIT);
    if (r > 0) {
      p.got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      *why = p.got == 0 ? "no handshake from peer" : "handshake cut short";
      return ECONNRESET;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return EAGAIN;
    *why = "no handshake from peer";
    return errno;
  }
}

}  // namespace

std::unique_ptr<QueuePair> TcpListener::accept(const QpOptions& requested,
                                               std::chrono::milliseconds timeout,
                                               std::span<const std::byte> reply) {
  check_qp_options(*progress_, requested, "accept", address_);
  if (reply.size() > Context::kMaxPrivateData) {
    throw Error("accept", "tcp", address_, EINVAL, "reply private data > 192 bytes");
  }
  const QpOptions options = adjust_options(requested);
  const auto deadline = Clock::now() + timeout;
  // Held while the pending set is looked at, not while waiting: several
  // threads may accept on one listener.
  std::unique_lock lock(mu_);
  int last_err = 0;
  std::string last_peer;
  const char* last_why = "";
  auto drop = [&](size_t i, int err, const char* why) {
    // One bad client must not take the listener down: log and go on.
    core::log().warn("tcp: accept from {}: {} ({})", pending_[i].peer, why,
                     std::strerror(err));
    last_err = err;
    last_why = why;
    last_peer = pending_[i].peer;
    pending_.erase(i);
  };
  for (;;) {
    accept_queued();
    const auto now = Clock::now();
    for (size_t i = 0; i < pending_.size();) {
      PendingHandshake& p = pending_[i];
      const char* why = "";
      const int err = read_handshake_step(p, &why);
      if (err == EAGAIN) {
        if (now < p.deadline) {
          ++i;
          continue;
        }
        drop(i, ETIMEDOUT, "no handshake from peer");
        continue;
      }
      if (err != 0) {
        drop(i, err, why);
        continue;
      }
      const auto hello = decode_hello(
          std::span<const std::byte>(p.buf.data() + kHeaderSize, p.got - kHeaderSize),
          Context::kMaxPrivateData);
      if (!hello) {
        drop(i, EPROTO, "handshake rejected (version, limits or length)");
        continue;
      }
      auto frame = encode_handshake_frame(options, reply);
      // A few hundred bytes into a fresh socket's buffer: does not block
      // unless the client never reads, and then only until its deadline.
      if (int werr = io_all(p.fd.get(), frame.data(), frame.size(), true,
                            std::min(deadline, p.deadline));
          werr != 0) {
        drop(i, werr, "could not answer the handshake");
        continue;
      }
      PendingHandshake done = pending_.take(i);
      tune_socket(done.fd.get(), options);
      core::log().debug("tcp: accepted {} on {}", done.peer, address_);
      std::vector<std::byte> pdata(done.buf.begin() + kHeaderSize + kHelloBodySize,
                                   done.buf.begin() + static_cast<ptrdiff_t>(done.got));
      // The queue pair owns the socket once constructed.
      auto qp = std::make_unique<TcpQp>(progress_, done.fd.get(), options, *hello,
                                        done.peer, std::move(pdata));
      done.fd.release();
      return qp;
    }
    const int left = ms_left(deadline);
    if (left == 0) {
      if (last_err != 0) {
        throw Error("accept", "tcp", last_peer, last_err == EPROTO ? EPROTO : ETIMEDOUT,
                    last_why);
      }
      throw Error("accept", "tcp", address_, ETIMEDOUT, "no connection request in time");
    }
    // Wait for a new client, a pending handshake or the next handshake deadline.
    std::vector<pollfd> pfds;
    pfds.reserve(pending_.size() + 1);
    pfds.push_back({fd_.get(), POLLIN, 0});
    int wait = left;
    for (const PendingHandshake& p : pending_) {
      pfds.push_back({p.fd.get(), POLLIN, 0});
      wait = std::min(wait, ms_left(p.deadline) + 1);
    }
    // Another thread may close one of these meanwhile: at worst a spurious
    // wake-up (the set is looked at again under the lock).
    lock.unlock();
    ::poll(pfds.data(), pfds.size(), wait);
    lock.lock();
  }
}

// A full backlog drops its oldest client (it has had the most time).
void TcpListener::accept_queued() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    core::Fd fd(::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &sl,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      throw Error("accept", "tcp", address_, errno, "accept failed");
    }
    if (pending_.full()) {
      core::log().warn("tcp: {}: {} handshakes pending, dropping the oldest (from {})",
                       address_, pending_.size(), pending_.front().peer);
    }
    PendingHandshake& p = pending_.emplace();
    p.fd = std::move(fd);
    p.peer = core::sockaddr_string(reinterpret_cast<const sockaddr*>(&ss));
    p.deadline = Clock::now() + kHandshakeTimeout;
  }
}

}  // namespace rdmakit::tcp
