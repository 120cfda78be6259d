// The tcp context: memory regions, CQs, SRQs, listen and connect. The
// handshake is in tcp_handshake.cpp, accept in tcp_listener.cpp.
#include "providers/tcp/tcp_context.hpp"

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
#include "providers/tcp/tcp_listener.hpp"
#include "providers/tcp/tcp_mr.hpp"
#include "providers/tcp/tcp_qp.hpp"
#include "providers/tcp/tcp_srq.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::tcp {
namespace {

using core::Clock;
using core::ms_left;

}  // namespace

TcpContext::TcpContext(bool progress_thread)
    : Context(ProviderKind::kTcp),
      progress_(std::make_shared<TcpProgress>(progress_thread)) {}

std::unique_ptr<MemoryRegion> TcpContext::register_memory(void* addr, size_t length,
                                                          uint32_t access) {
  if ((access & ~static_cast<uint32_t>(kAccessAll)) != 0 ||
      (addr == nullptr && length != 0)) {
    throw Error("register_memory", "tcp", "", EINVAL, "bad address or access bits");
  }
  MrEntry* e = progress_->mrs().add(reinterpret_cast<uint64_t>(addr), length, access);
  return std::make_unique<TcpMr>(progress_, e, addr, length, access, false);
}

std::unique_ptr<MemoryRegion> TcpContext::allocate(size_t length, uint32_t access) {
  if ((access & ~static_cast<uint32_t>(kAccessAll)) != 0) {
    throw Error("allocate", "tcp", "", EINVAL, "bad access bits");
  }
  // Plain anonymous pages: zero-filled and page-aligned; tcp gains nothing
  // from memfd or huge pages.
  void* p = ::mmap(nullptr, std::max<size_t>(length, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error("allocate", "tcp", "", errno, "mmap");
  try {
    MrEntry* e = progress_->mrs().add(reinterpret_cast<uint64_t>(p), length, access);
    return std::make_unique<TcpMr>(progress_, e, p, length, access, true);
  } catch (...) {
    ::munmap(p, std::max<size_t>(length, 1));
    throw;
  }
}

std::unique_ptr<CompletionQueue> TcpContext::create_cq(const CqOptions& options) {
  return std::make_unique<TcpCq>(progress_, options);
}

std::unique_ptr<SharedReceiveQueue> TcpContext::create_srq(const SrqOptions& options) {
  if (options.max_wr == 0 || options.max_wr > kMaxWr) {
    throw Error("create_srq", "tcp", "", EINVAL,
                "max_wr must be 1.." + std::to_string(kMaxWr));
  }
  return std::make_unique<TcpSrq>(progress_, options);
}

std::unique_ptr<Listener> TcpContext::listen(const std::string& address) {
  const core::HostPort hp = core::parse_host_port(address, "listen", "tcp");
  addrinfo* res = resolve(hp, true, "listen", address);
  int err = EADDRNOTAVAIL;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    core::Fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      err = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(fd.get(), 128) != 0) {
      err = errno;
      continue;
    }
    ::freeaddrinfo(res);
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
    const std::string bound =
        core::sockaddr_string(reinterpret_cast<const sockaddr*>(&ss));
    const uint16_t port = ss.ss_family == AF_INET
                              ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                              : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    core::log().info("tcp: listening on {}", bound);
    return std::make_unique<TcpListener>(progress_, std::move(fd), bound, port);
  }
  ::freeaddrinfo(res);
  throw Error("listen", "tcp", address, err, "cannot bind");
}

std::unique_ptr<QueuePair> TcpContext::connect(const std::string& address,
                                               const QpOptions& requested,
                                               std::span<const std::byte> private_data,
                                               std::chrono::milliseconds timeout) {
  check_qp_options(*progress_, requested, "connect", address);
  if (private_data.size() > kMaxPrivateData) {
    throw Error("connect", "tcp", address, EINVAL, "private data > 192 bytes");
  }
  const QpOptions options = adjust_options(requested);
  const core::HostPort hp = core::parse_host_port(address, "connect", "tcp");
  const auto deadline = Clock::now() + timeout;
  addrinfo* res = resolve(hp, false, "connect", address);
  int err = EHOSTUNREACH;
  core::Fd fd;
  for (addrinfo* ai = res; ai != nullptr && !fd; ai = ai->ai_next) {
    fd.reset(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      err = errno;
      continue;
    }
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      rc = ::poll(&pfd, 1, ms_left(deadline));
      if (rc == 0) {
        errno = ETIMEDOUT;
        rc = -1;
      } else {
        int so = 0;
        socklen_t sl = sizeof so;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &sl);
        errno = so;
        rc = so == 0 ? 0 : -1;
      }
    }
    if (rc != 0) {
      err = errno;
      fd.reset();
    }
  }
  ::freeaddrinfo(res);
  if (!fd) throw Error("connect", "tcp", address, err, "cannot connect");
  auto frame = encode_handshake_frame(options, private_data);
  Hello hello;
  std::vector<std::byte> pdata;
  const char* why = "could not send the handshake";
  err = io_all(fd.get(), frame.data(), frame.size(), true, deadline);
  if (err == 0) err = read_handshake(fd.get(), deadline, &hello, &pdata, &why);
  if (err != 0) throw Error("connect", "tcp", address, err, why);
  tune_socket(fd.get(), options);
  core::log().debug("tcp: connected to {}", address);
  // The queue pair owns the socket once constructed.
  auto qp = std::make_unique<TcpQp>(progress_, fd.get(), options, hello, address,
                                    std::move(pdata));
  fd.release();
  return qp;
}

std::unique_ptr<QueuePair> TcpContext::adopt(int fd, const QpOptions& options,
                                             const Hello& peer_hello, std::string peer) {
  check_qp_options(*progress_, options, "adopt", peer);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::make_unique<TcpQp>(progress_, fd, adjust_options(options), peer_hello,
                                 std::move(peer), std::vector<std::byte>{});
}

}  // namespace rdmakit::tcp

namespace rdmakit::core {
std::unique_ptr<Context> make_tcp_context(const ContextOptions&) {
  // RDMAKIT_TCP_PROGRESS_THREAD=0 leaves all progress to the polling threads
  // (one-sided ops are then served only while the target polls).
  const char* env = std::getenv("RDMAKIT_TCP_PROGRESS_THREAD");
  const bool thread = env == nullptr || std::strcmp(env, "0") != 0;
  if (!thread)
    core::log().info("tcp: progress thread disabled by RDMAKIT_TCP_PROGRESS_THREAD=0");
  return std::make_unique<tcp::TcpContext>(thread);
}
}  // namespace rdmakit::core
