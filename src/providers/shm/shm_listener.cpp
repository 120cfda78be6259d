#include "providers/shm/shm_listener.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>

#include "core/address.hpp"
#include "core/log.hpp"
#include "providers/shm/shm_context.hpp"
#include "providers/shm/shm_qp.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

int bind_abstract(int sock, uint16_t port) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return ::bind(sock, reinterpret_cast<sockaddr*>(&sa), len);
}

// Who holds a port's name: the kernel's credentials of its listener.
std::string holder_of(uint16_t port) {
  // Non-blocking: a squatter that never accepts must not hold listen() up.
  Fd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = abstract_name(port);
  std::memcpy(sa.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  PeerCred cred;
  if (!probe || ::connect(probe.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      !peer_cred(probe.get(), &cred)) {
    return "the port's name is taken";
  }
  return fmt::format("the port's name is taken by pid {} of uid {}{}", cred.pid, cred.uid,
                     cred.uid != ::geteuid() ? " (another user)" : "");
}

}  // namespace

ShmListener::ShmListener(ShmContext& context, const std::string& address)
    : context_(context) {
  const auto where = core::parse_host_port(address, "listen", "shm");
  host_ = where.host;
  // Non-blocking: accept_queued() takes what is queued and no more.
  socket_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket_) throw Error("listen", "shm", address, errno, "socket");
  if (where.port != 0) {
    if (bind_abstract(socket_.get(), where.port) != 0) {
      const int err = errno;
      throw Error("listen", "shm", address, err,
                  err == EADDRINUSE ? holder_of(where.port) : std::string("bind"));
    }
    port_ = where.port;
  } else {
    // Port 0: the abstract namespace has no ephemeral ports; probe from a
    // random start in the dynamic range.
    std::minstd_rand rng(std::random_device{}());
    constexpr uint32_t kFirst = 20000, kCount = 40000;
    const uint32_t start = rng() % kCount;
    for (uint32_t i = 0; i < kCount && port_ == 0; ++i) {
      const auto candidate = static_cast<uint16_t>(kFirst + (start + i) % kCount);
      if (bind_abstract(socket_.get(), candidate) == 0) {
        port_ = candidate;
      } else if (errno != EADDRINUSE) {
        throw Error("listen", "shm", address, errno, "bind");
      }
    }
    if (port_ == 0) throw Error("listen", "shm", address, EADDRINUSE, "no free port");
  }
  if (::listen(socket_.get(), 128) != 0) {
    throw Error("listen", "shm", address, errno, "listen");
  }
  core::log().debug("shm: listening on {}", this->address());
}

std::unique_ptr<QueuePair> ShmListener::accept(const QpOptions& options,
                                               std::chrono::milliseconds timeout,
                                               std::span<const std::byte> reply) {
  if (reply.size() > Context::kMaxPrivateData) {
    throw Error("accept", "shm", address(), EINVAL, "private data larger than 192 bytes");
  }
  const auto deadline = core::Clock::now() + timeout;
  // Held while the pending set is looked at, not while waiting.
  std::unique_lock lock(mu_);
  for (;;) {
    accept_queued();
    std::vector<pollfd> pfds;
    pfds.reserve(pending_.size() + 1);
    for (const Pending& p : pending_) pfds.push_back({p.conn.get(), POLLIN, 0});
    if (!pending_.empty() && ::poll(pfds.data(), pfds.size(), 0) < 0 && errno != EINTR) {
      throw Error("accept", "shm", address(), errno, "poll");
    }
    const auto now = core::Clock::now();
    std::optional<Error> failure;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const bool readable = pfds[i].revents != 0;
      if (!readable && now < pending_[i].deadline) continue;
      Pending p = pending_.take(i);
      pfds.erase(pfds.begin() + static_cast<ptrdiff_t>(i));
      --i;
      if (!readable) {
        const std::string why = fmt::format("no handshake within {} ms of connecting",
                                            kHandshakeTimeout.count());
        core::log().warn("shm: {}: dropped the connection from {}: {}", address(), p.peer,
                         why);
        if (!failure) failure.emplace("accept", "shm", p.peer, ECONNABORTED, why);
        continue;
      }
      PeerEnd remote;
      try {
        // A SEQPACKET Hello arrives whole: this does not wait.
        remote = receive_handshake(p.conn.get(), "accept", p.peer, p.cred, context_,
                                   std::chrono::milliseconds(0));
      } catch (const Error& e) {
        // One bad client must not take the listener down: log and go on.
        core::log().warn("shm: {}: dropped the connection from {}: {}", address(), p.peer,
                         e.what());
        if (!failure) failure = e;
        continue;
      }
      LocalEnd local = prepare_local_end(context_, options, remote.other_user);
      if (int rc = send_handshake(p.conn.get(), context_, local, options, reply, true);
          rc != 0) {
        throw Error("accept", "shm", p.peer, -rc, "sending handshake");
      }
      return std::make_unique<ShmQp>(context_, options, std::move(local),
                                     std::move(remote));
    }
    if (failure) throw *failure;
    const int left = core::ms_left(deadline);
    if (left == 0) {
      throw Error("accept", "shm", address(), ETIMEDOUT,
                  pending_.empty() ? "no connection request"
                                   : fmt::format("no handshake arrived ({} connected "
                                                 "clients pending)",
                                                 pending_.size()));
    }
    int wait = left;
    pfds.clear();
    pfds.push_back({socket_.get(), POLLIN, 0});
    for (const Pending& p : pending_) {
      pfds.push_back({p.conn.get(), POLLIN, 0});
      wait = std::min(wait, core::ms_left(p.deadline) + 1);
    }
    lock.unlock();
    ::poll(pfds.data(), pfds.size(), wait);  // EINTR: looked at again
    lock.lock();
  }
}

void ShmListener::accept_queued() {
  for (;;) {
    Fd conn(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      throw Error("accept", "shm", address(), errno, "accept");
    }
    PeerCred cred;
    if (!peer_cred(conn.get(), &cred)) {
      core::log().warn("shm: {}: dropped a connection: SO_PEERCRED failed ({})",
                       address(), std::strerror(errno));
      continue;
    }
    const PeerPolicy& policy = context_.peer_policy();
    if (!policy.admits(cred.uid)) {
      // Refused before anything of ours is exchanged; accept() goes on
      // waiting for admitted clients.
      send_refusal(conn.get(), RejectReason::kUserNotAdmitted);
      // The first few, then one in 1000: another user must not flood our log.
      if (++refused_ <= 10 || refused_ % 1000 == 0) {
        core::log().warn("shm: {}: refused a connection ({} so far): {}", address(),
                         refused_, policy.refusal(cred.uid, cred.pid, "client"));
      }
      continue;
    }
    if (pending_.full()) {
      core::log().warn("shm: {}: {} handshakes pending, dropping the oldest (from {})",
                       address(), pending_.size(), pending_.front().peer);
    }
    pending_.emplace(Pending{std::move(conn),
                             fmt::format("pid {} uid {}", cred.pid, cred.uid), cred,
                             core::Clock::now() + kHandshakeTimeout});
  }
}

}  // namespace rdmakit::shm
