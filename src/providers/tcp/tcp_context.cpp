// tcp provider control path: context, memory regions, listener, connect and
// the handshake (one kHello frame each way, with limits and private data).
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

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

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
namespace {

using core::Clock;
using core::ms_left;
// Per accepted client: its HELLO (sent right after its connect) and our
// answer must make it within this. Handshakes are served concurrently, at
// most kMaxPendingHandshakes at a time per listener (each holds one socket
// and a 268-byte buffer); a full backlog drops its oldest client.
constexpr std::chrono::milliseconds kHandshakeTimeout{1000};
constexpr size_t kMaxPendingHandshakes = 64;

class TcpMr final : public MemoryRegion {
 public:
  TcpMr(std::shared_ptr<Engine> engine, MrEntry* entry, void* addr, size_t length,
        uint32_t access, bool mapped)
      : MemoryRegion(addr, length, entry->lkey.load(), entry->rkey.load(), access,
                     ProviderKind::kTcp),
        engine_(std::move(engine)),
        entry_(entry),
        mapped_(mapped) {}
  ~TcpMr() override {
    engine_->deregister(entry_);
    if (mapped_) ::munmap(addr(), length());
  }

 private:
  std::shared_ptr<Engine> engine_;
  MrEntry* entry_;
  bool mapped_;
};

// Blocking-with-deadline I/O on a non-blocking socket (handshake only).
int io_all(int fd, std::byte* buf, size_t len, bool write, Clock::time_point deadline) {
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

std::vector<std::byte> encode_hello_frame(const QpOptions& o,
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
int read_hello(int fd, Clock::time_point deadline, Hello* out,
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
void check_qp_options(const Engine& engine, const QpOptions& requested, const char* op,
                      const std::string& peer) {
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
    if (srq == nullptr || srq->engine() != &engine) {
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

// One accepted client whose HELLO is still arriving. The frame is read
// into a fixed buffer (its size bounded before anything is read).
struct PendingHandshake {
  core::Fd fd;
  std::string peer;
  Clock::time_point deadline;
  std::array<std::byte, kHeaderSize + kHelloBodySize + Context::kMaxPrivateData> buf{};
  size_t got = 0;
};

// Reads what has arrived of a pending client's HELLO without blocking.
// Returns 0 when complete, EAGAIN when more is needed, else an error (why).
int read_hello_step(PendingHandshake& p, const char** why) {
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

class TcpListener final : public Listener {
 public:
  TcpListener(std::shared_ptr<Engine> engine, core::Fd fd, std::string address,
              uint16_t port)
      : engine_(std::move(engine)),
        fd_(std::move(fd)),
        address_(std::move(address)),
        port_(port) {}

  // Handshakes run concurrently: every client accepted is pending until its
  // HELLO has arrived (each within kHandshakeTimeout), and the first to
  // complete is answered. Silent clients therefore cost a slot of a bounded
  // backlog, not time of the clients behind them.
  std::unique_ptr<QueuePair> accept(const QpOptions& requested,
                                    std::chrono::milliseconds timeout,
                                    std::span<const std::byte> reply) override {
    check_qp_options(*engine_, requested, "accept", address_);
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
      pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
    };
    for (;;) {
      accept_queued();
      const auto now = Clock::now();
      for (size_t i = 0; i < pending_.size();) {
        PendingHandshake& p = pending_[i];
        const char* why = "";
        const int err = read_hello_step(p, &why);
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
        auto frame = encode_hello_frame(options, reply);
        // A few hundred bytes into a fresh socket's buffer: does not block
        // unless the client never reads, and then only until its deadline.
        if (int werr = io_all(p.fd.get(), frame.data(), frame.size(), true,
                              std::min(deadline, p.deadline));
            werr != 0) {
          drop(i, werr, "could not answer the handshake");
          continue;
        }
        PendingHandshake done = std::move(p);
        pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
        tune_socket(done.fd.get(), options);
        core::log().debug("tcp: accepted {} on {}", done.peer, address_);
        std::vector<std::byte> pdata(done.buf.begin() + kHeaderSize + kHelloBodySize,
                                     done.buf.begin() + static_cast<ptrdiff_t>(done.got));
        // The queue pair owns the socket once constructed.
        auto qp = std::make_unique<TcpQp>(engine_, done.fd.get(), options, *hello,
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
        throw Error("accept", "tcp", address_, ETIMEDOUT,
                    "no connection request in time");
      }
      // Wait for a new client, a pending HELLO or the next handshake deadline.
      std::vector<pollfd> pfds;
      pfds.reserve(pending_.size() + 1);
      pfds.push_back({fd_.get(), POLLIN, 0});
      int wait = left;
      for (const PendingHandshake& p : pending_) {
        pfds.push_back({p.fd.get(), POLLIN, 0});
        wait = std::min(wait, ms_left(p.deadline) + 1);
      }
      // Another thread may close one of these meanwhile: at worst a
      // spurious wake-up (the set is looked at again under the lock).
      lock.unlock();
      ::poll(pfds.data(), pfds.size(), wait);
      lock.lock();
    }
  }
  std::string address() const override { return address_; }
  uint16_t port() const override { return port_; }

 private:
  // Takes every connection the kernel has queued into the pending set. A
  // full backlog drops its oldest client (it has had the most time).
  void accept_queued() {
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
      if (pending_.size() >= kMaxPendingHandshakes) {
        core::log().warn("tcp: {}: {} handshakes pending, dropping the oldest (from {})",
                         address_, pending_.size(), pending_.front().peer);
        pending_.erase(pending_.begin());
      }
      PendingHandshake& p = pending_.emplace_back();
      p.fd = std::move(fd);
      p.peer = core::sockaddr_string(reinterpret_cast<const sockaddr*>(&ss));
      p.deadline = Clock::now() + kHandshakeTimeout;
    }
  }

  std::shared_ptr<Engine> engine_;
  core::Fd fd_;
  std::string address_;
  uint16_t port_;
  std::mutex mu_;  // guards pending_ (accept() may run in several threads)
  std::vector<PendingHandshake> pending_;
};

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

}  // namespace

TcpContext::TcpContext(bool progress_thread)
    : Context(ProviderKind::kTcp), engine_(std::make_shared<Engine>(progress_thread)) {}

std::unique_ptr<MemoryRegion> TcpContext::register_memory(void* addr, size_t length,
                                                          uint32_t access) {
  if ((access & ~static_cast<uint32_t>(kAccessAll)) != 0 ||
      (addr == nullptr && length != 0)) {
    throw Error("register_memory", "tcp", "", EINVAL, "bad address or access bits");
  }
  MrEntry* e = engine_->mrs().add(reinterpret_cast<uint64_t>(addr), length, access);
  return std::make_unique<TcpMr>(engine_, e, addr, length, access, false);
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
    MrEntry* e = engine_->mrs().add(reinterpret_cast<uint64_t>(p), length, access);
    return std::make_unique<TcpMr>(engine_, e, p, length, access, true);
  } catch (...) {
    ::munmap(p, std::max<size_t>(length, 1));
    throw;
  }
}

std::unique_ptr<CompletionQueue> TcpContext::create_cq(const CqOptions& options) {
  return std::make_unique<TcpCq>(engine_, options);
}

std::unique_ptr<SharedReceiveQueue> TcpContext::create_srq(const SrqOptions& options) {
  if (options.max_wr == 0 || options.max_wr > kMaxWr) {
    throw Error("create_srq", "tcp", "", EINVAL,
                "max_wr must be 1.." + std::to_string(kMaxWr));
  }
  return std::make_unique<TcpSrq>(engine_, options);
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
    return std::make_unique<TcpListener>(engine_, std::move(fd), bound, port);
  }
  ::freeaddrinfo(res);
  throw Error("listen", "tcp", address, err, "cannot bind");
}

std::unique_ptr<QueuePair> TcpContext::connect(const std::string& address,
                                               const QpOptions& requested,
                                               std::span<const std::byte> private_data,
                                               std::chrono::milliseconds timeout) {
  check_qp_options(*engine_, requested, "connect", address);
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
  auto frame = encode_hello_frame(options, private_data);
  Hello hello;
  std::vector<std::byte> pdata;
  const char* why = "could not send the handshake";
  err = io_all(fd.get(), frame.data(), frame.size(), true, deadline);
  if (err == 0) err = read_hello(fd.get(), deadline, &hello, &pdata, &why);
  if (err != 0) throw Error("connect", "tcp", address, err, why);
  tune_socket(fd.get(), options);
  core::log().debug("tcp: connected to {}", address);
  // The queue pair owns the socket once constructed.
  auto qp = std::make_unique<TcpQp>(engine_, fd.get(), options, hello, address,
                                    std::move(pdata));
  fd.release();
  return qp;
}

std::unique_ptr<QueuePair> TcpContext::adopt(int fd, const QpOptions& options,
                                             const Hello& peer_hello, std::string peer) {
  check_qp_options(*engine_, options, "adopt", peer);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::make_unique<TcpQp>(engine_, fd, adjust_options(options), peer_hello,
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
