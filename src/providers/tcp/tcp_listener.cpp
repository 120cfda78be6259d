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

std::unique_ptr<QueuePair> TcpListener::accept(const QpOptions& requested,
                                               std::chrono::milliseconds timeout,
                                               std::span<const std::byte> reply) {
  check_qp_options(*engine_, requested, "accept", address_);
  if (reply.size() > Context::kMaxPrivateData) {
    throw Error("accept", "tcp", address_, EINVAL, "reply private data > 192 bytes");
  }
  const QpOptions options = adjust_options(requested);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    core::Fd fd(::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &sl,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        throw Error("accept", "tcp", address_, errno, "accept failed");
      }
      const int left = ms_left(deadline);
      if (left == 0) {
        throw Error("accept", "tcp", address_, ETIMEDOUT,
                    "no connection request in time");
      }
      pollfd pfd{fd_.get(), POLLIN, 0};
      ::poll(&pfd, 1, left);
      continue;
    }
    const std::string peer =
        core::sockaddr_string(reinterpret_cast<const sockaddr*>(&ss));
    Hello hello;
    std::vector<std::byte> pdata;
    const char* why = "";
    // A client that connects and says nothing must not hold the whole
    // deadline: the ones queued behind it would fail too.
    const auto hs_deadline = std::min(deadline, Clock::now() + kHandshakeTimeout);
    int err = read_handshake(fd.get(), hs_deadline, &hello, &pdata, &why);
    if (err == 0) {
      auto frame = encode_handshake_frame(options, reply);
      err = io_all(fd.get(), frame.data(), frame.size(), true, hs_deadline);
      why = "could not answer the handshake";
    }
    if (err != 0) {
      // One bad client must not take the listener down: log and go on
      // until the deadline.
      fd.reset();
      core::log().warn("tcp: accept from {}: {} ({})", peer, why, std::strerror(err));
      if (ms_left(deadline) == 0) {
        throw Error("accept", "tcp", peer, err == EPROTO ? EPROTO : ETIMEDOUT, why);
      }
      continue;
    }
    tune_socket(fd.get(), options);
    core::log().debug("tcp: accepted {} on {}", peer, address_);
    // The queue pair owns the socket once constructed.
    auto qp = std::make_unique<TcpQp>(engine_, fd.get(), options, hello, peer,
                                      std::move(pdata));
    fd.release();
    return qp;
  }
}

}  // namespace rdmakit::tcp
