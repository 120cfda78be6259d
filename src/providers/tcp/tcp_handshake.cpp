#include "providers/tcp/tcp_handshake.hpp"

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
#include "providers/tcp/tcp_qp.hpp"
#include "providers/tcp/tcp_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {

using core::Clock;
using core::ms_left;

int io_all(int fd, std::byte* buf, size_t len, bool write,
           core::Clock::time_point deadline) {
  size_t done = 0;
  while (done < len) {
    const ssize_t r =
        write ? ::send(fd, buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
              : ::recv(fd, buf + done, len - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return ECONNRESET;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    const int left = ms_left(deadline);
    if (left == 0) return ETIMEDOUT;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    ::poll(&pfd, 1, left);
  }
  return 0;
}

void tune_socket(int fd, const QpOptions& o) {
  const int one = 1;
  // Latency: small frames leave at once; batching is done by us (sendmsg).
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Unacknowledged data to a vanished peer fails after peer_timeout; our
  // heartbeats cover the idle case, keepalive is a backstop.
  const unsigned user_timeout = static_cast<unsigned>(o.peer_timeout.count());
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  const int idle = std::max<int>(1, static_cast<int>(o.peer_timeout.count() / 1000));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof idle);
  const int cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

std::vector<std::byte> encode_handshake_frame(const QpOptions& o,
                                              std::span<const std::byte> private_data) {
  Hello h;
  h.max_send_wr = o.max_send_wr;
  h.max_recv_wr = o.max_recv_wr;
  h.rnr_timeout_ms =
      static_cast<uint32_t>(std::min<int64_t>(o.rnr_timeout.count(), UINT32_MAX));
  h.peer_timeout_ms =
      static_cast<uint32_t>(std::min<int64_t>(o.peer_timeout.count(), UINT32_MAX));
  h.private_len = static_cast<uint32_t>(private_data.size());
  std::vector<std::byte> frame(kHeaderSize + kHelloBodySize + private_data.size());
  // The hello header is built by hand: decode_header() rejects kHello so it
  // can never appear inside a QP stream.
  Header hdr;
  hdr.length = static_cast<uint32_t>(kHelloBodySize + private_data.size());
  encode_header(hdr, frame.data());
  frame[0] = static_cast<std::byte>(WireOp::kHello);
  encode_hello(h, frame.data() + kHeaderSize);
  if (!private_data.empty()) {
    std::memcpy(frame.data() + kHeaderSize + kHelloBodySize, private_data.data(),
                private_data.size());
  }
  return frame;
}

// Reads one hello frame; on failure returns errno-ish code and why.
int read_handshake(int fd, core::Clock::time_point deadline, Hello* out,
                   std::vector<std::byte>* private_data, const char** why) {
  std::byte hdr[kHeaderSize];
  if (int err = io_all(fd, hdr, sizeof hdr, false, deadline); err != 0) {
    *why = "no handshake from peer";
    return err;
  }
  uint32_t len;
  std::memcpy(&len, hdr + 4, sizeof len);
  len = core::to_little(len);
  if (hdr[0] != static_cast<std::byte>(WireOp::kHello) || len < kHelloBodySize ||
      len > kHelloBodySize + Context::kMaxPrivateData) {
    *why = "peer is not an rdmakit tcp endpoint (bad handshake)";
    return EPROTO;
  }
  std::vector<std::byte> body(len);
  if (int err = io_all(fd, body.data(), len, false, deadline); err != 0) {
    *why = "handshake cut short";
    return err;
  }
  const auto hello = decode_hello(body, Context::kMaxPrivateData);
  if (!hello) {
    *why = "handshake rejected (version, limits or length)";
    return EPROTO;
  }
  *out = *hello;
  private_data->assign(body.begin() + kHelloBodySize, body.end());
  return 0;
}

// Checked before any connection is made, so a bad option costs no peer a
// half-open QP. TcpQp's constructor reserves the CQ depths for real.
void check_qp_options(const TcpProgress& progress, const QpOptions& requested,
                      const char* op, const std::string& peer) {
  const QpOptions o = adjust_options(requested);
  if (o.send_cq == nullptr || o.recv_cq == nullptr) {
    throw Error(op, "tcp", peer, EINVAL, "QpOptions needs send_cq and recv_cq");
  }
  auto* send_cq = dynamic_cast<TcpCq*>(o.send_cq);
  auto* recv_cq = dynamic_cast<TcpCq*>(o.recv_cq);
  if (send_cq == nullptr || recv_cq == nullptr) {
    throw Error(op, "tcp", peer, EINVAL, "completion queues are not from a tcp context");
  }
  TcpSrq* srq = nullptr;
  if (o.srq != nullptr) {
    srq = dynamic_cast<TcpSrq*>(o.srq);
    if (srq == nullptr || srq->progress() != &progress) {
      throw Error(op, "tcp", peer, EINVAL,
                  "QpOptions::srq is not a shared receive queue of this tcp context");
    }
  }
  const uint32_t recv_depth = srq != nullptr ? srq->max_wr() : o.max_recv_wr;
  const bool fits = send_cq == recv_cq ? send_cq->has_room(o.max_send_wr, recv_depth, srq)
                                       : send_cq->has_room(o.max_send_wr, 0, nullptr) &&
                                             recv_cq->has_room(0, recv_depth, srq);
  if (!fits) {
    throw Error(
        op, "tcp", peer, EINVAL,
        "completion queue capacity is smaller than the queue depths attached to it "
        "(max_send_wr " +
            std::to_string(o.max_send_wr) + " + receive depth " +
            std::to_string(recv_depth) +
            " on top of the QPs already attached and the unpolled completions of "
            "destroyed ones)");
  }
}

addrinfo* resolve(const core::HostPort& hp, bool passive, const char* op,
                  const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp.port);
  const int rc = ::getaddrinfo(hp.host == "*" ? nullptr : hp.host.c_str(), port.c_str(),
                               &hints, &res);
  if (rc != 0) {
    throw Error(op, "tcp", address, rc == EAI_SYSTEM ? errno : EHOSTUNREACH,
                std::string("cannot resolve host: ") + ::gai_strerror(rc));
  }
  return res;
}

}  // namespace rdmakit::tcp
