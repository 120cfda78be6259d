#include "providers/shm/shm_listener.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

}  // namespace

ShmListener::ShmListener(ShmContext& context, const std::string& address)
    : context_(context) {
  const auto where = core::parse_host_port(address, "listen", "shm");
  host_ = where.host;
  socket_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!socket_) throw Error("listen", "shm", address, errno, "socket");
  if (where.port != 0) {
    if (bind_abstract(socket_.get(), where.port) != 0) {
      throw Error("listen", "shm", address, errno, "bind");
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
  pollfd pfd{socket_.get(), POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) throw Error("accept", "shm", address(), errno, "poll");
  if (ready == 0)
    throw Error("accept", "shm", address(), ETIMEDOUT, "no connection request");
  Fd conn(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn) throw Error("accept", "shm", address(), errno, "accept");

  ucred cred{};
  socklen_t cred_len = sizeof cred;
  std::string peer =
      "pid " + std::to_string(::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred,
                                           &cred_len) == 0
                                  ? cred.pid
                                  : 0);
  PeerEnd remote = receive_handshake(conn.get(), "accept", peer, timeout);
  LocalEnd local = prepare_local_end(context_, options);
  if (int rc = send_handshake(conn.get(), context_, local, options, reply, true);
      rc != 0) {
    throw Error("accept", "shm", peer, -rc, "sending handshake");
  }
  return std::make_unique<ShmQueuePair>(context_, options, std::move(local),
                                        std::move(remote));
}

}  // namespace rdmakit::shm
