#include "rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "adoption.hpp"
#include "fd_place.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "remote.hpp"
#include "rendezvous_users.hpp"
#include "rendezvous_wire.hpp"
#include "sock_diag.hpp"
#include "stale_files.hpp"
#include "state.hpp"

namespace rdmakit::preload {

using namespace wire;  // NOLINT(google-build-using-namespace)

namespace {

using std::chrono::milliseconds;

// Fills the tuple from the socket; "" or why it is not a candidate here.
std::string read_tuple(int fd, bool client, Tuple* t, std::string* where) {
  sockaddr_storage peer{};
  std::string why = socket_tuple(fd, client, t, where, &peer);
  if (!why.empty()) return why;
  sockaddr_storage local{};
  socklen_t ll = sizeof local;
  (void)real().getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll);  // NOLINT
  if (!loopback(peer) || !loopback(local))
    return "peer is not on this host (loopback only)";
  return {};
}

std::string tuple_path(const Tuple& t, char prefix) {
  char name[32];
  std::snprintf(name, sizeof name, "/%c-%016llx", prefix,
                static_cast<unsigned long long>(tuple_hash(t)));
  return config().dir + name;
}

std::string listener_path(uint16_t port) {
  return config().dir + "/l-" + std::to_string(port);
}

// A file naming this process (the listener registry).
void write_pid_file(const std::string& path) {
  write_file_whole(path, std::to_string(process_id()) + "\n");
}

// The pid such a file names (0: none or unreadable).
pid_t read_pid_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32] = {};
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  const pid_t pid = n > 0 ? static_cast<pid_t>(std::atoi(buf)) : 0;
  return pid > 0 ? pid : 0;
}

pid_t registered_listener(uint16_t port) {
  const pid_t pid = read_pid_file(listener_path(port));
  return pid > 0 && alive(pid) ? pid : 0;
}

// Only a process of our own uid may take part (root is trusted by all).
std::string check_peer(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (real().getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return std::string("SO_PEERCRED: ") + std::strerror(errno);
  }
  if (cred.uid != geteuid()) {
    return "rendezvous peer pid " + std::to_string(cred.pid) + " runs as uid " +
           std::to_string(cred.uid) + ", not " + std::to_string(geteuid()) + ": refused";
  }
  return {};
}

sockaddr_un unix_address(const std::string& path, bool* fits) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  *fits = path.size() < sizeof sa.sun_path;
  if (*fits) std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  return sa;
}

}  // namespace

void write_file_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(process_id());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  (void)real().write(fd, text.data(), text.size());
  real().close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
}

bool alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

void register_listener(uint16_t port) {
  sweep_stale_files();
  register_host_listener(port);
  if (!config().dir_problem.empty()) return;
  write_pid_file(listener_path(port));
}

void unregister_listener(uint16_t port) {
  close_remote_listener(port);
  unregister_host_listener(port);
  if (!config().dir_problem.empty()) return;
  const std::string path = listener_path(port);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  char buf[32] = {};
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  // Only the process that registered it (a forked child closing its copy of
  // the listener leaves the registration alone).
  if (n > 0 && std::atoi(buf) == process_id()) unlink(path.c_str());
}

bool loopback_connection(int tcp_fd) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t ll = sizeof local;
  socklen_t pl = sizeof peer;
  return real().getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&local), &ll) ==
             0 &&  // NOLINT
         real().getpeername(tcp_fd, reinterpret_cast<sockaddr*>(&peer), &pl) ==
             0 &&  // NOLINT
         (local.ss_family == AF_INET || local.ss_family == AF_INET6) &&
         loopback(local) && loopback(peer);
}

namespace {
// The file named `prefix` for tcp_fd's connection, seen from its client
// (client) or accepted end; "" when unusable.
std::string connection_path(int tcp_fd, bool client, char prefix) {
  if (!config().dir_problem.empty()) return {};
  Tuple t;
  std::string where;
  if (!read_tuple(tcp_fd, client, &t, &where).empty()) return {};
  return tuple_path(t, prefix);
}
}  // namespace

std::string adoption_marker(int tcp_fd, bool client) {
  return connection_path(tcp_fd, client, client ? 'b' : 'a');
}

std::string connect_offer_path(int tcp_fd) { return connection_path(tcp_fd, true, 'o'); }

bool offer_is_remote(const PendingOffer& offer) { return offer.remote; }

bool offer_listener_here(const PendingOffer& offer) { return offer.listener_here; }

void PendingOfferDelete::operator()(PendingOffer* p) const noexcept { delete p; }

PendingOfferPtr prepare_connect(int fd, const sockaddr* dest, std::string* reason) {
  const Config& cfg = config();
  sockaddr_storage peer{};
  std::memcpy(&peer, dest,
              dest->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (!loopback(peer)) return prepare_remote(fd, peer, reason);
  auto p = PendingOfferPtr(new PendingOffer());
  Tuple& t = p->tuple;
  put(peer, t.server_addr, &t.server_port);
  const uint16_t port = ntohs(t.server_port);
  // Our own user's listener (the private registry), else a preloaded
  // listener of another user (the host-wide one).
  const pid_t listener = cfg.dir_problem.empty() ? registered_listener(port) : 0;
  const bool same_user = listener != 0;
  if (listener == process_id()) p->mark_listener_here();
  std::string other_why;
  if (!same_user && !other_user_listener(port, &other_why)) {
    *reason = !cfg.dir_problem.empty()
                  ? "rendezvous directory unusable: " + cfg.dir_problem
                  : "no rdmakit listener on port " + std::to_string(port) +
                        " (peer not rdmakit-enabled)" +
                        (other_why.empty() ? "" : "; " + other_why);
    return nullptr;
  }
  // The offer must exist before the peer can accept, so the client end is
  // bound now (an unbound socket would get its port only in connect()).
  in_addr v4{htonl(INADDR_LOOPBACK)};
  in6_addr v6 = in6addr_loopback;
  if (peer.ss_family == AF_INET6 &&
      IN6_IS_ADDR_V4MAPPED(
          &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr)) {  // NOLINT
    v6 = reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr;       // NOLINT
  }
  sockaddr_storage local{};
  if (std::string failed = bind_unbound(fd, v4, v6, &local); !failed.empty()) {
    *reason = failed;
    return nullptr;
  }
  t.family = static_cast<uint8_t>(put(local, t.client_addr, &t.client_port));
  if (!same_user) {
    *reason = listen_other_user_offer(p.get());
    return reason->empty() ? std::move(p) : nullptr;
  }
  std::string why;
  stream::Engine* eng = engine(&why);
  if (eng == nullptr) {
    *reason = why;
    return nullptr;
  }
  try {
    p->listener = eng->listen("127.0.0.1:0");
  } catch (const std::exception& e) {
    *reason = std::string("stream listener: ") + e.what();
    return nullptr;
  }
  reserve_stream(eng, +1);
  p->reserved_on = eng;
  p->made_by = process_id();
  p->offer.tuple = t;
  p->offer.stream_port = p->listener->port();
  if (getrandom(p->offer.client_nonce.data(), kNonce, 0) !=
      static_cast<ssize_t>(kNonce)) {
    *reason = "getrandom failed";
    return nullptr;
  }
  p->path = tuple_path(t, 'o');
  bool fits = false;
  const sockaddr_un sa = unix_address(p->path, &fits);
  if (!fits) {
    *reason = "rendezvous path too long: " + p->path;
    return nullptr;
  }
  const int us = place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (us < 0) {
    *reason = std::string("rendezvous socket: ") + std::strerror(errno);
    return nullptr;
  }
  unlink(p->path.c_str());
  p->usock = us;
  if (bind(us, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||  // NOLINT
      real().listen(us, 1) != 0) {
    *reason = "rendezvous socket " + p->path + ": " + std::strerror(errno);
    return nullptr;
  }
  // The process that accepts may run as another user than the one that
  // listened (it dropped privileges after listen()): it cannot reach this
  // private directory, so the offer is on the abstract name as well. Best
  // effort: a name another process holds leaves the private offer alone.
  if (other_users_enabled()) {
    std::string ignored;
    p->other_usock = listen_on_other_user_name(t, &ignored);
  }
  return p;
}

namespace {

// An offer prepared before a fork and taken up in the child: its stream
// listener is on the parent's engine, which has no progress thread here, so
// this process listens anew (the offer is sent only when the server comes).
std::string listen_again(PendingOffer& p) {
  (void)p.listener.release();  // the parent's, in memory this child copied
  p.reserved_on = nullptr;
  std::string why;
  stream::Engine* eng = engine(&why);
  if (eng == nullptr) return why;
  try {
    p.listener = eng->listen("127.0.0.1:0");
  } catch (const std::exception& e) {
    return std::string("stream listener: ") + e.what();
  }
  reserve_stream(eng, +1);
  p.reserved_on = eng;
  p.made_by = process_id();
  p.offer.stream_port = p.listener->port();
  return {};
}

}  // namespace

Upgrade finish_connect(PendingOfferPtr p, int tcp_fd) {
  if (p->remote) return finish_remote(*p, tcp_fd);
  if (p->other_user) return finish_other_user(*p, tcp_fd);
  Upgrade up;
  const Config& cfg = config();
  Tuple t;
  std::string where;
  up.reason = read_tuple(tcp_fd, true, &t, &where);
  if (!up.reason.empty()) return up;
  if (std::memcmp(&t, &p->tuple, sizeof t) != 0) {
    up.reason = "connection is not the one offered (address changed in connect)";
    return up;
  }
  const auto deadline = Clock::now() + cfg.timeout;
  if (p->made_by != process_id()) {
    up.reason = listen_again(*p);
    if (!up.reason.empty()) return up;
  }
  try {
    pollfd pfd[2] = {{p->usock, POLLIN, 0}, {p->other_usock, POLLIN, 0}};
    int ready = 0;
    for (;;) {
      ready =
          poll_through_signals(pfd, p->other_usock >= 0 ? 2 : 1, remaining_ms(deadline));
      if (ready <= 0 || (pfd[0].revents & POLLIN) != 0 || p->other_usock < 0) break;
      // An acceptor of another uid took the abstract offer up.
      const int private_offer = p->usock;
      p->usock = std::exchange(p->other_usock, -1);
      bool proven = false;
      Upgrade other = finish_other_user(*p, tcp_fd, &proven);
      p->usock = private_offer;
      if (other.stream != nullptr || proven) return other;
      // Not the server (anyone may connect to an abstract name): the offer
      // in the private directory still waits for it.
      log_line("connect: %s; still waiting for the server", other.reason.c_str());
    }
    Fd c(ready > 0 ? place_high(real().accept4(p->usock, nullptr, nullptr, SOCK_CLOEXEC))
                   : -1);
    // One-shot: a late peer finds nothing and stays on TCP.
    unlink(p->path.c_str());
    real().close(p->usock);
    p->usock = -1;
    if (ready <= 0) {
      up.reason = "peer did not take up the rendezvous within " +
                  std::to_string(cfg.timeout.count()) + " ms";
      return up;
    }
    if (c.get() < 0) {
      up.reason = std::string("rendezvous accept: ") + std::strerror(errno);
      return up;
    }
    up.reason = check_peer(c.get());
    if (!up.reason.empty()) return up;
    if (!io_all(c.get(), &p->offer, sizeof p->offer, true, deadline)) {
      up.reason = "rendezvous: peer went away before the offer";
      return up;
    }
    up.stream = client_commit(c.get(), *p->listener, p->offer.client_nonce, deadline,
                              &up.reason, tcp_fd, -1, p->early);
  } catch (const std::exception& e) {
    up.reason = std::string("upgrade failed: ") + e.what();
  }
  return up;
}

namespace {

constexpr const char* kClosedBeforeUse =
    "the client closed the connection before using it";

// The client closed its end of the kernel connection.
bool peer_closed(int tcp_fd) {
  pollfd hup{tcp_fd, POLLRDHUP, 0};
  return real().poll(&hup, 1, 0) == 1 && (hup.revents & (POLLRDHUP | POLLHUP)) != 0;
}

}  // namespace

Upgrade upgrade_accepted(int tcp_fd, const std::string& deny, uint32_t deny_status) {
  Upgrade up;
  const Config& cfg = config();
  Tuple t;
  std::string where;
  sockaddr_storage peer{};
  up.reason = socket_tuple(tcp_fd, false, &t, &where, &peer);
  if (!up.reason.empty()) return up;
  sockaddr_storage local{};
  socklen_t ll = sizeof local;
  (void)real().getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&local), &ll);  // NOLINT
  if (!loopback(peer) || !loopback(local)) return accept_remote(tcp_fd, t, deny);
  // A client of our own user offers in the private directory, one of
  // another user on an abstract socket.
  int offer_fd = -1;
  if (cfg.dir_problem.empty()) {
    const std::string path = tuple_path(t, 'o');
    bool fits = false;
    const sockaddr_un sa = unix_address(path, &fits);
    offer_fd =
        fits ? place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) : -1;
    if (offer_fd >= 0 && real().connect(offer_fd, reinterpret_cast<const sockaddr*>(&sa),
                                        sizeof sa) != 0) {  // NOLINT
      real().close(offer_fd);
      offer_fd = -1;
    }
  }
  Fd c(offer_fd);
  if (c.get() < 0) {
    if (answer_other_user(tcp_fd, t, deny, deny_status, &up)) return up;
    // A client that closed its end before using it withdrew its offer.
    up.reason = !deny.empty()         ? deny
                : peer_closed(tcp_fd) ? kClosedBeforeUse
                : !cfg.dir_problem.empty()
                    ? "rendezvous directory unusable: " + cfg.dir_problem
                    : "no rendezvous offer from the peer (peer not rdmakit-enabled)";
    return up;
  }
  const auto deadline = Clock::now() + cfg.timeout;
  auto refused = [&](std::string why) {
    refuse(c.get(), 1, deadline);
    up.reason = std::move(why);
    return std::move(up);
  };
  up.reason = check_peer(c.get());
  if (!up.reason.empty()) return up;
  Offer offer;
  // A process that got the client's end before its first use (an exec'd
  // program, whose creator may watch no offers: a vfork) may have kept it
  // on kernel TCP (creator.hpp): its marker says so, for the client
  // socket's inode, which the kernel names.
  AdoptionMarker client_marker{tuple_path(t, 'b'), 0};
  bool kept_on_kernel = false;
  const auto withdrawn = [&] {
    if (client_marker.socket == 0) {
      const auto ino = client_socket_inode(t);
      if (!ino) return false;
      client_marker.socket = *ino;
    }
    kept_on_kernel = read_adoption(client_marker).holder == Holder::kKernel;
    return kept_on_kernel;
  };
  if (!read_offer(c.get(), tcp_fd, &offer, deadline, withdrawn)) {
    // The client withdraws its offer after closing its kernel socket
    // (close()): an offer taken up just before then ends with the stream.
    up.reason = peer_closed(tcp_fd) ? kClosedBeforeUse
                : kept_on_kernel ? "rendezvous: a process holding the client's end kept "
                                   "it on kernel TCP"
                                 : no_offer_reason(tcp_fd);
    return up;
  }
  if (std::string bad = offer_problem(offer); !bad.empty()) {
    return refused("rendezvous: " + bad);
  }
  if (std::memcmp(&offer.tuple, &t, sizeof t) != 0) {
    return refused("rendezvous: offer names another connection: refused");
  }
  if (!deny.empty()) {
    refuse(c.get(), deny_status, deadline);
    up.reason = deny + " (offer refused)";
    return up;
  }
  std::string why;
  stream::Engine* eng = engine(&why);
  if (eng == nullptr) return refused(why);
  try {
    up.stream =
        server_commit(c.get(), *eng, "127.0.0.1:" + std::to_string(offer.stream_port),
                      offer.client_nonce, deadline, &up.reason, -1, tcp_fd);
  } catch (const std::exception& e) {
    up.reason = std::string("upgrade failed: ") + e.what();
  }
  return up;
}

}  // namespace rdmakit::preload
