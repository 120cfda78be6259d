#include "rendezvous_wire.hpp"

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "state.hpp"

namespace rdmakit::preload::wire {

using std::chrono::milliseconds;

namespace {
bool all_zero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}
}  // namespace

uint64_t tuple_hash(const Tuple& t) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = reinterpret_cast<const uint8_t*>(&t);  // NOLINT
  for (size_t i = 0; i < sizeof t; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::string offer_problem(const Offer& offer) {
  if (offer.magic != kMagic || offer.version != kVersion) {
    return "malformed offer (magic/version)";
  }
  const Tuple& t = offer.tuple;
  if (t.family != AF_INET && t.family != AF_INET6) return "malformed offer (family)";
  const size_t alen = t.family == AF_INET6 ? 16 : 4;
  if (!all_zero(t.pad, sizeof t.pad) || !all_zero(offer.pad, sizeof offer.pad) ||
      !all_zero(t.client_addr + alen, 16 - alen) ||
      !all_zero(t.server_addr + alen, 16 - alen)) {
    return "malformed offer (padding)";
  }
  if (t.client_port == 0 || t.server_port == 0 || offer.stream_port == 0) {
    return "malformed offer (port 0)";
  }
  return {};
}

bool loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);  // NOLINT
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);  // NOLINT
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

int put(const sockaddr_storage& ss, uint8_t* addr, uint16_t* port) {
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);  // NOLINT
    *port = in6->sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      std::memcpy(addr, &in6->sin6_addr.s6_addr[12], 4);
      return AF_INET;
    }
    std::memcpy(addr, &in6->sin6_addr, 16);
    return AF_INET6;
  }
  const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);  // NOLINT
  std::memcpy(addr, &in->sin_addr, 4);
  *port = in->sin_port;
  return AF_INET;
}

std::string socket_tuple(int fd, bool client, Tuple* t, std::string* where,
                         sockaddr_storage* peer_out) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t ll = sizeof local;
  socklen_t pl = sizeof peer;
  if (real().getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||  // NOLINT
      real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) {   // NOLINT
    return std::string("getsockname/getpeername: ") + std::strerror(errno);
  }
  *where = "local=" + endpoint(reinterpret_cast<sockaddr*>(&local)) +  // NOLINT
           " peer=" + endpoint(reinterpret_cast<sockaddr*>(&peer));    // NOLINT
  if (peer_out != nullptr) *peer_out = peer;
  *t = Tuple{};
  const int family = client ? put(local, t->client_addr, &t->client_port)
                            : put(peer, t->client_addr, &t->client_port);
  if (client) {
    put(peer, t->server_addr, &t->server_port);
  } else {
    put(local, t->server_addr, &t->server_port);
  }
  t->family = static_cast<uint8_t>(family);
  return {};
}

std::string check_offered(int fd, const Tuple& offered) {
  Tuple t;
  std::string where;
  std::string why = socket_tuple(fd, true, &t, &where);
  if (why.empty() && std::memcmp(&t, &offered, sizeof t) != 0)
    why = "connection is not the one offered (address changed in connect)";
  return why;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

bool io_all(int fd, void* buf, size_t len, bool out, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < len) {
    const ssize_t n =
        out ? real().send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
            : real().recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return false;
    if (errno != EAGAIN && errno != EINTR) return false;
    pollfd pfd{fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    const int left = remaining_ms(deadline);
    if (left == 0 || poll_through_signals(&pfd, 1, left) == 0) return false;
  }
  return true;
}

std::string exchange_nonces(stream::Stream& s, const Nonce& expect, const Nonce& send,
                            Clock::time_point deadline) {
  const auto left = milliseconds(std::max(remaining_ms(deadline), 1));
  s.set_timeouts(left, left);
  const ssize_t w = s.write(send.data(), send.size());
  if (w != static_cast<ssize_t>(send.size())) {
    return "stream nonce write: " + std::string(std::strerror(static_cast<int>(-w)));
  }
  Nonce got{};
  const ssize_t r = s.read(got.data(), got.size(), stream::Stream::kWaitAll);
  if (r != static_cast<ssize_t>(got.size())) {
    return "stream nonce read: " +
           std::string(r < 0 ? std::strerror(static_cast<int>(-r)) : "short read");
  }
  if (got != expect) return "stream peer presented a wrong nonce: refused";
  s.set_timeouts(milliseconds(0), milliseconds(0));
  return {};
}

std::string send_token(int kernel_fd, const Token& token, Clock::time_point deadline) {
  Token t = token;
  errno = 0;  // io_all gives up on the deadline without one
  if (!io_all(kernel_fd, &t, sizeof t, true, deadline)) {
    return std::string("could not write the proof on the connection: ") +
           (errno != 0 ? std::strerror(errno) : "timed out");
  }
  return {};
}

std::string take_token(int kernel_fd, const Token& token, Clock::time_point deadline) {
  const char* from = token.direction == kFromServer ? "acceptor" : "client";
  Token got;
  for (;;) {
    const ssize_t n = real().recv(kernel_fd, &got, sizeof got, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) {
      // Compared as far as it arrived: a plain server's first bytes (an
      // ssh or smtp banner) are refused at once, and left where they are.
      if (std::memcmp(&got, &token, static_cast<size_t>(n)) != 0) {
        return std::string("the connection's first bytes are not the ") + from +
               "'s proof (the rendezvous peer is not the process at the other end of "
               "this connection): refused";
      }
      if (n == static_cast<ssize_t>(sizeof got)) break;
    } else if (n == 0) {
      return std::string("the connection closed before the ") + from + "'s proof";
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return std::string("reading the ") + from + "'s proof: " + std::strerror(errno);
    }
    const int left = remaining_ms(deadline);
    if (left == 0) {
      return std::string("no proof from the ") + from +
             " on the connection within the budget (the rendezvous peer is not the "
             "process at the other end of this connection)";
    }
    if (n > 0) {
      // Part of it is there (poll would not wait): the rest is one segment behind.
      std::this_thread::sleep_for(milliseconds(1));
    } else {
      pollfd pfd{kernel_fd, POLLIN, 0};
      (void)poll_through_signals(&pfd, 1, left);
    }
  }
  // Every byte matched: consume exactly the token, nothing after it.
  if (real().recv(kernel_fd, &got, sizeof got, MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof got)) {
    return std::string("consuming the ") + from + "'s proof: " + std::strerror(errno);
  }
  return {};
}

namespace {

// Reads and drops n bytes from the kernel socket, bounded by deadline; ""
// or why not.
std::string drop_early(int fd, uint32_t n, Clock::time_point deadline) {
  char scratch[4096];
  uint32_t left = n;
  while (left > 0) {
    const ssize_t r =
        real().recv(fd, scratch, std::min<size_t>(left, sizeof scratch), MSG_DONTWAIT);
    if (r > 0) {
      left -= static_cast<uint32_t>(r);
      continue;
    }
    if (r < 0 && errno != EAGAIN && errno != EINTR) {
      return std::string("the client's early bytes: ") + std::strerror(errno);
    }
    pollfd pfd{fd, POLLIN, 0};
    if (r == 0 || remaining_ms(deadline) == 0 ||
        poll_through_signals(&pfd, 1, remaining_ms(deadline)) == 0) {
      return "the client's early bytes did not arrive on kernel TCP (" +
             std::to_string(n - left) + " of " + std::to_string(n) + ")";
    }
  }
  return {};
}

}  // namespace

bool read_offer(int rdv, int tcp_fd, Offer* offer, Clock::time_point deadline,
                const std::function<bool()>& withdrawn) {
  bool watch_tcp = true;  // until early bytes or the end of stream show
  for (;;) {
    if (watch_tcp) {
      uint8_t b = 0;
      const ssize_t n = real().recv(tcp_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n >= 0) watch_tcp = false;
      if (n > 0) deadline = std::min(deadline, Clock::now() + kEarlyOfferWait);
    }
    pollfd pfd[2] = {{rdv, POLLIN, 0}, {tcp_fd, POLLIN, 0}};
    const int left = remaining_ms(deadline);
    const int wait =
        withdrawn ? std::min(left, static_cast<int>(kWithdrawnTick.count())) : left;
    const int r = poll_through_signals(pfd, watch_tcp ? 2 : 1, wait);
    if (r < 0 || (r == 0 && (wait == left || withdrawn()))) return false;
    if (r == 0) continue;
    if ((pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      return io_all(rdv, offer, sizeof *offer, false, deadline);
    }
    // Only the kernel socket woke: look at what arrived.
  }
}

std::string no_offer_reason(int tcp_fd) {
  uint8_t b = 0;
  if (real().recv(tcp_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
    return "rendezvous: the client sent before the server used the connection and did "
           "not answer within " +
           std::to_string(kEarlyOfferWait.count()) +
           " ms (stopped, or its library could not answer)";
  }
  return "rendezvous: no offer received";
}

std::string moved_outside(int tcp_fd, uint64_t sent, uint64_t received) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (tcp_fd < 0 || getsockopt(tcp_fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) {
    return {};
  }
  // Counted only on an established connection whose SYN was acknowledged
  // (a kernel, or a sandbox, that does not count leaves them 0); a FIN
  // either way would count too, and is the connection's end, not data.
  constexpr uint8_t kEstablished =
      1;  // TCP_ESTABLISHED: netinet/tcp.h clashes with linux/tcp.h
  if (ti.tcpi_state != kEstablished || ti.tcpi_bytes_acked == 0) return {};
  int queued = 0;  // written, not acknowledged yet
  if (real().ioctl(tcp_fd, SIOCOUTQ, &queued) != 0) return {};
  // An active opener's acknowledged bytes count its SYN.
  const uint64_t written = ti.tcpi_bytes_acked - 1 + static_cast<uint64_t>(queued);
  if (written == sent && ti.tcpi_bytes_received == received) return {};
  return "bytes moved on the connection outside the library before the upgrade (" +
         std::to_string(written) + " written, " + std::to_string(sent) +
         " of them by rdmakit; " + std::to_string(ti.tcpi_bytes_received) +
         " received, " + std::to_string(received) +
         " by rdmakit): stdio or a raw system call, which rdmakit does not see";
}

std::unique_ptr<stream::Stream> client_commit(int rdv, stream::StreamListener& listener,
                                              const Nonce& client_nonce,
                                              Clock::time_point deadline,
                                              std::string* reason, int tcp_fd,
                                              int kernel_fd, const std::string& early) {
  Answer answer;
  if (!io_all(rdv, &answer, sizeof answer, false, deadline) || answer.magic != kMagic) {
    *reason = "rendezvous: no answer from the peer";
    return nullptr;
  }
  if (answer.status == kDeniedByRules) {
    *reason = "the peer's allow/deny rules keep this connection on kernel TCP";
    return nullptr;
  }
  if (answer.status == kNotCarried) {
    *reason = "the peer passes the connection to a program that is not preloaded";
    return nullptr;
  }
  if (answer.status == kUsedOutside) {
    *reason =
        "the peer reads the connection outside the library (stdio or a raw system call)";
    return nullptr;
  }
  if (answer.status != 0) {
    *reason = "peer refused the upgrade (status " + std::to_string(answer.status) + ")";
    return nullptr;
  }
  Token proof;
  proof.client_nonce = client_nonce;
  proof.server_nonce = answer.server_nonce;
  if (kernel_fd >= 0) {
    // Before any stream is accepted: a rendezvous peer that is not the
    // acceptor of this connection gets nothing more from us.
    Final please;
    please.status = kProofPlease;
    if (!io_all(rdv, &please, sizeof please, true, deadline)) {
      *reason = "rendezvous: peer went away before the proof";
      return nullptr;
    }
    proof.direction = kFromServer;
    *reason = take_token(kernel_fd, proof, deadline);
    if (!reason->empty()) return nullptr;
  }
  auto s = listener.accept(milliseconds(std::max(remaining_ms(deadline), 1)));
  *reason = exchange_nonces(*s, client_nonce, answer.server_nonce, deadline);
  if (!reason->empty()) return nullptr;
  // The last moment before the commit: bytes the application moved where
  // the hooks do not see would be lost once the stream carries it. Not
  // committing leaves both ends on kernel TCP (the server sees no commit).
  *reason = moved_outside(tcp_fd, early.size(), kernel_fd >= 0 ? sizeof proof : 0);
  if (!reason->empty()) return nullptr;
  Final fin;
  fin.early_bytes = static_cast<uint32_t>(early.size());
  if (!io_all(rdv, &fin, sizeof fin, true, deadline)) {
    *reason = "rendezvous: peer went away before the commit";
    return nullptr;
  }
  if (!early.empty()) {
    // Committed: the server reads the stream next, and these come first.
    const auto left = milliseconds(std::max(remaining_ms(deadline), 1));
    s->set_timeouts(left, left);
    const ssize_t w = s->write(early.data(), early.size());
    s->set_timeouts(milliseconds(0), milliseconds(0));
    if (w != static_cast<ssize_t>(early.size())) {
      *reason = "the early bytes could not be written on the stream: " +
                std::string(std::strerror(static_cast<int>(w < 0 ? -w : EIO)));
      (void)s->abort();
      return nullptr;
    }
  }
  if (kernel_fd >= 0) {
    // Committed: the acceptor proved itself, so this in-band write reaches
    // rdmakit; it waits for these bytes before it commits.
    proof.direction = kFromClient;
    *reason = send_token(kernel_fd, proof, deadline + std::chrono::seconds(5));
    if (!reason->empty()) return nullptr;
  }
  return s;
}

std::unique_ptr<stream::Stream> server_commit(int rdv, stream::Engine& engine,
                                              const std::string& stream_address,
                                              const Nonce& client_nonce,
                                              Clock::time_point deadline,
                                              std::string* reason, int kernel_fd,
                                              int early_fd) {
  Answer yes;
  if (getrandom(yes.server_nonce.data(), kNonce, 0) != static_cast<ssize_t>(kNonce)) {
    refuse(rdv, 1, deadline);
    *reason = "getrandom failed";
    return nullptr;
  }
  if (!io_all(rdv, &yes, sizeof yes, true, deadline)) {
    *reason = "rendezvous: peer went away before the answer";
    return nullptr;
  }
  Token proof;
  proof.client_nonce = client_nonce;
  proof.server_nonce = yes.server_nonce;
  if (kernel_fd >= 0) {
    // Only when the client asks, right after the answer: a client that has
    // given up has closed the rendezvous and never gets a token in-band.
    Final please;
    if (!io_all(rdv, &please, sizeof please, false, deadline) || please.magic != kMagic ||
        please.status != kProofPlease) {
      *reason = "rendezvous: the peer did not ask for the proof";
      return nullptr;
    }
    // A client that has written on the connection already is not the one
    // that offered (that one writes nothing before our proof): its bytes
    // are the application's, and no token goes in front of them.
    uint8_t first = 0;
    if (real().recv(kernel_fd, &first, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
      *reason =
          "the client wrote on the connection before the upgrade (the rendezvous peer is "
          "not the process at the other end of this connection): refused";
      return nullptr;
    }
    proof.direction = kFromServer;
    *reason = send_token(kernel_fd, proof, deadline);
    if (!reason->empty()) return nullptr;
  }
  auto s = engine.connect(stream_address);
  *reason = exchange_nonces(*s, yes.server_nonce, client_nonce, deadline);
  if (!reason->empty()) return nullptr;
  // The client commits after sending this; it has checked both nonces.
  Final fin;
  if (!io_all(rdv, &fin, sizeof fin, false, deadline + std::chrono::seconds(5)) ||
      fin.magic != kMagic || fin.status != 0 || fin.early_bytes > kMaxEarlyBytes ||
      (fin.early_bytes != 0 && early_fd < 0)) {
    *reason = "rendezvous: peer did not commit";
    return nullptr;
  }
  if (fin.early_bytes != 0) {
    // Sent before the commit, so they are here or on their way; the client
    // writes them again first on the stream.
    *reason = drop_early(early_fd, fin.early_bytes, deadline + std::chrono::seconds(5));
    if (!reason->empty()) {
      (void)s->abort();
      return nullptr;
    }
  }
  if (kernel_fd >= 0) {
    // The rendezvous peer must also own the client end: an offer left by
    // another process of the client's host for a plain client's connection
    // gets no stream (that client's own bytes are not the token).
    proof.direction = kFromClient;
    *reason = take_token(kernel_fd, proof, deadline + std::chrono::seconds(5));
    if (!reason->empty()) return nullptr;
  }
  return s;
}

void refuse(int rdv, uint32_t status, Clock::time_point deadline) {
  Answer no;
  no.status = status;
  (void)io_all(rdv, &no, sizeof no, true, deadline);
}

Fd::~Fd() {
  if (fd_ >= 0) real().close(fd_);
}

std::string bind_unbound(int fd, const in_addr& v4, const in6_addr& v6,
                         sockaddr_storage* local) {
  socklen_t ll = sizeof *local;
  if (real().getsockname(fd, reinterpret_cast<sockaddr*>(local), &ll) != 0) {  // NOLINT
    return std::string("getsockname: ") + std::strerror(errno);
  }
  uint16_t port = 0;
  uint8_t scratch[16];
  (void)put(*local, scratch, &port);
  if (port != 0) return "";
  sockaddr_storage to{};
  socklen_t tl = 0;
  if (local->ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&to);  // NOLINT
    in->sin_family = AF_INET;
    in->sin_addr = v4;
    tl = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&to);  // NOLINT
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = v6;
    tl = sizeof *in6;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&to), tl) != 0) {  // NOLINT
    return std::string("bind before connect: ") + std::strerror(errno);
  }
  ll = sizeof *local;
  (void)real().getsockname(fd, reinterpret_cast<sockaddr*>(local), &ll);  // NOLINT
  return "";
}

}  // namespace rdmakit::preload::wire

namespace rdmakit::preload {

namespace {
std::atomic<int> g_offers_here{0};  // offers to a listener of this process
std::atomic<int> g_deferred{0};     // offers settled at first use (handoff.hpp)
}  // namespace

bool offers_to_this_process() noexcept {
  return g_offers_here.load(std::memory_order_relaxed) > 0;
}

bool any_deferred_offer() noexcept {
  return g_deferred.load(std::memory_order_relaxed) > 0;
}

void PendingOffer::mark_deferred() noexcept {
  if (!deferred) g_deferred.fetch_add(1, std::memory_order_relaxed);
  deferred = true;
}

void PendingOffer::mark_listener_here() noexcept {
  if (!listener_here) g_offers_here.fetch_add(1, std::memory_order_relaxed);
  listener_here = true;
}

PendingOffer::~PendingOffer() {
  if (listener_here) g_offers_here.fetch_sub(1, std::memory_order_relaxed);
  if (deferred) g_deferred.fetch_sub(1, std::memory_order_relaxed);
  if (reserved_on != nullptr) reserve_stream(reserved_on, -1);
  if (usock >= 0) {
    if (!remote) unlink(path.c_str());
    real().close(usock);
  }
  if (other_usock >= 0) real().close(other_usock);
}

}  // namespace rdmakit::preload
