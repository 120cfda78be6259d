#include "rendezvous_users.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fd_place.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay_wire.hpp"
#include "sock_diag.hpp"
#include "state.hpp"

namespace rdmakit::preload {

using namespace wire;  // NOLINT(google-build-using-namespace)

namespace {

constexpr int kProofWaitMs = 200;

struct HostDir {
  std::string prefix;   // "<dir>/rdmakit-l-<netns inode>-"
  std::string problem;  // why the path is off ("" = usable)
};

// The registration directory: shared by every user, so it must be one where
// only a file's owner can replace or remove it (sticky, or not writable by
// others).
const HostDir& host_dir() {
  static const HostDir dir = [] {
    HostDir d;
    const char* env = std::getenv("RDMAKIT_PRELOAD_OTHER_USERS");
    if (env != nullptr && std::strcmp(env, "0") == 0) {
      d.problem = "RDMAKIT_PRELOAD_OTHER_USERS=0";
      return d;
    }
    const char* base = std::getenv("RDMAKIT_PRELOAD_HOST_DIR");
    const std::string path = base != nullptr && *base == '/' ? base : "/dev/shm";
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      d.problem = "host directory " + path + " is not a directory";
    } else if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
      d.problem = "host directory " + path + " is writable by all and not sticky";
    } else if (st.st_uid != 0 && st.st_uid != geteuid()) {
      d.problem =
          "host directory " + path + " belongs to uid " + std::to_string(st.st_uid);
    }
    struct stat ns {};
    const auto ino = stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
    d.prefix = path + "/rdmakit-l-" + std::to_string(ino) + "-";
    return d;
  }();
  return dir;
}

std::string registration(uint16_t port) {
  return host_dir().prefix + std::to_string(port);
}

sockaddr_un offer_address(const Tuple& t, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  char name[48];
  const int n = std::snprintf(name, sizeof name, "rdmakit-o-%016llx",
                              static_cast<unsigned long long>(tuple_hash(t)));
  std::memcpy(sa.sun_path + 1, name, static_cast<size_t>(n));  // abstract: leading NUL
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

bool peer_cred(int fd, ucred* cred) {
  socklen_t len = sizeof *cred;
  return real().getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0;
}

// The descriptor the server sent is a TCP socket whose ends mirror ours.
std::string check_proof(int proof, const Tuple& ours) {
  int protocol = 0;
  socklen_t len = sizeof protocol;
  if (proof < 0) return "the server's proof came without its descriptor";
  if (real().getsockopt(proof, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
      protocol != IPPROTO_TCP) {
    return "the server's proof is not a TCP socket";
  }
  Tuple mirror;
  std::string where;
  if (!socket_tuple(proof, false, &mirror, &where).empty() ||
      std::memcmp(&mirror, &ours, sizeof ours) != 0) {
    return "the server's proof is another connection (" + where + ")";
  }
  return {};
}

std::string who(const ucred& c) {
  return "pid " + std::to_string(c.pid) + " (uid " + std::to_string(c.uid) + ")";
}

}  // namespace

bool other_users_enabled() { return host_dir().problem.empty(); }

std::string host_registration_prefix() {
  return other_users_enabled() ? host_dir().prefix : std::string();
}

void register_host_listener(uint16_t port) {
  if (!other_users_enabled()) return;
  const std::string path = registration(port);
  const std::string tmp = path + ".tmp" + std::to_string(process_id());
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "%d\n", static_cast<int>(process_id()));
  (void)real().write(fd, buf, static_cast<size_t>(n));
  real().close(fd);
  // In a sticky directory a file of another user cannot be replaced: that
  // user holds the name, and clients of other users stay on kernel TCP.
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    log_line(
        "listen port=%u: %s is held by another user (%s): clients of other users stay "
        "on kernel TCP",
        static_cast<unsigned>(port), path.c_str(), std::strerror(errno));
    unlink(tmp.c_str());
  }
}

void unregister_host_listener(uint16_t port) {
  if (!other_users_enabled()) return;
  const std::string path = registration(port);
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  char buf[32] = {};
  struct stat st {};
  const bool mine = fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
                    real().read(fd, buf, sizeof buf - 1) > 0 &&
                    std::atoi(buf) == process_id();
  real().close(fd);
  if (mine) unlink(path.c_str());
}

bool other_user_listener(uint16_t port, std::string* why) {
  if (!other_users_enabled()) {
    *why = host_dir().problem;
    return false;
  }
  const std::string path = registration(port);
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[32] = {};
  struct stat st {};
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const ssize_t n = regular ? real().read(fd, buf, sizeof buf - 1) : -1;
  real().close(fd);
  const pid_t pid = n > 0 ? static_cast<pid_t>(std::atoi(buf)) : 0;
  if (!regular || st.st_uid == geteuid() || pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;  // a stale registration
  // A registration is believed only from the user whose socket listens on
  // the port: another user's file would make clients wait for nobody.
  const auto owners = listener_uids(port);
  if (std::find(owners.begin(), owners.end(), st.st_uid) == owners.end()) {
    *why = path + " belongs to uid " + std::to_string(st.st_uid) +
           ", which owns no socket listening on port " + std::to_string(port);
    return false;
  }
  return true;
}

int listen_on_other_user_name(const Tuple& t, std::string* why) {
  socklen_t len = 0;
  const sockaddr_un sa = offer_address(t, &len);
  const int s = place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s < 0) {
    *why = std::string("rendezvous socket: ") + std::strerror(errno);
    return -1;
  }
  if (bind(s, reinterpret_cast<const sockaddr*>(&sa), len) != 0 ||  // NOLINT
      real().listen(s, 1) != 0) {
    // Another process holds the name: it might answer as the client would.
    *why = std::string("the abstract offer socket for this connection is taken (") +
           std::strerror(errno) + ")";
    real().close(s);
    return -1;
  }
  return s;
}

std::string listen_other_user_offer(PendingOffer* p) {
  p->other_user = true;
  if (getrandom(p->offer.client_nonce.data(), kNonce, 0) != static_cast<ssize_t>(kNonce))
    return "getrandom failed";
  p->offer.tuple = p->tuple;
  std::string why;
  p->usock = listen_on_other_user_name(p->tuple, &why);
  return why;
}

Upgrade finish_other_user(PendingOffer& p, int tcp_fd, bool* proven) {
  // The streams' own calls on this thread (the shm handshake receives a peer
  // of another user's wake socket) are not the application's: with a
  // sanitizer runtime preloaded, the return address cannot tell.
  const InternalScope internal;
  Upgrade up;
  up.reason = check_offered(tcp_fd, p.tuple);
  if (!up.reason.empty()) return up;
  const auto deadline = Clock::now() + config().timeout;
  pollfd pfd{p.usock, POLLIN, 0};
  const int ready = poll_through_signals(&pfd, 1, remaining_ms(deadline));
  Fd c(ready > 0 ? real().accept4(p.usock, nullptr, nullptr, SOCK_CLOEXEC) : -1);
  real().close(p.usock);  // one-shot: a late peer finds nothing
  p.usock = -1;
  if (c.get() < 0) {
    up.reason = ready <= 0 ? "the server (another user) did not take up the rendezvous "
                             "within " +
                                 std::to_string(config().timeout.count()) + " ms"
                           : std::string("rendezvous accept: ") + std::strerror(errno);
    return up;
  }
  ucred cred{};
  if (!peer_cred(c.get(), &cred)) {
    up.reason = std::string("SO_PEERCRED: ") + std::strerror(errno);
    return up;
  }
  OwnerProof hello;
  int proof = -1;
  // A server sends its proof as soon as it connects; anyone may connect to
  // an abstract name, and one that sends nothing holds us only this long.
  if (!relay_wire::recv_with_fds(c.get(), &hello, sizeof hello, &proof, 1,
                                 std::min(remaining_ms(deadline), kProofWaitMs))) {
    if (proof >= 0) real().close(proof);
    up.reason =
        "rendezvous peer " + who(cred) + " sent no proof of holding the connection";
    return up;
  }
  Fd held(proof);
  if (hello.magic != kMagic || hello.version != kVersion ||
      std::memcmp(&hello.tuple, &p.tuple, sizeof p.tuple) != 0) {
    up.reason = "rendezvous peer " + who(cred) + " sent a malformed proof: refused";
    return up;
  }
  if (hello.status == kDeniedByRules) {
    up.reason = "the server's rules keep this connection on kernel TCP";
    return up;
  }
  if (hello.status == kNotCarried) {
    up.reason = "the server passes the connection to a program that is not preloaded";
    return up;
  }
  if (hello.status == kUsedOutside) {
    up.reason =
        "the server reads the connection outside the library (stdio or a raw system "
        "call)";
    return up;
  }
  up.reason = check_proof(held.get(), p.tuple);
  if (!up.reason.empty()) {
    up.reason = "rendezvous peer " + who(cred) + ": " + up.reason + ": refused";
    return up;
  }
  if (proven != nullptr) *proven = true;
  stream::Engine* eng = engine_for_user(cred.uid, &up.reason);
  if (eng == nullptr) return up;
  try {
    auto listener = eng->listen("127.0.0.1:0");
    p.offer.stream_port = listener->port();
    if (!io_all(c.get(), &p.offer, sizeof p.offer, true, deadline)) {
      up.reason = "rendezvous: peer went away before the offer";
      return up;
    }
    up.stream = client_commit(c.get(), *listener, p.offer.client_nonce, deadline,
                              &up.reason, tcp_fd, -1, p.early);
  } catch (const std::exception& e) {
    up.reason = std::string("upgrade failed: ") + e.what();
  }
  return up;
}

bool answer_other_user(int tcp_fd, const Tuple& t, const std::string& deny,
                       uint32_t deny_status, Upgrade* up) {
  if (!other_users_enabled()) return false;
  const InternalScope internal;  // as in finish_other_user
  socklen_t len = 0;
  const sockaddr_un sa = offer_address(t, &len);
  Fd c(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (c.get() < 0 || real().connect(c.get(), reinterpret_cast<const sockaddr*>(&sa),
                                    len) != 0)  // NOLINT
    return false;
  ucred cred{};
  if (!peer_cred(c.get(), &cred)) {
    up->reason = std::string("SO_PEERCRED: ") + std::strerror(errno);
    return true;
  }
  // Our end goes only to the user whose socket is the client end: anyone
  // can take an abstract name.
  const auto owner = client_socket_uid(t);
  if (!owner || *owner != cred.uid) {
    up->reason = "the offer for this connection is held by " + who(cred) +
                 ", but the client end " +
                 (owner ? "belongs to uid " + std::to_string(*owner) : "was not found") +
                 ": refused, nothing sent";
    return true;
  }
  const auto deadline = Clock::now() + config().timeout;
  OwnerProof hello;
  hello.tuple = t;
  if (!deny.empty()) {
    hello.status = deny_status;
    (void)relay_wire::send_with_fds(c.get(), &hello, sizeof hello, nullptr, 0);
    up->reason = deny + " (offer refused)";
    return true;
  }
  if (!relay_wire::send_with_fds(c.get(), &hello, sizeof hello, &tcp_fd, 1)) {
    up->reason = std::string("rendezvous: sending the proof: ") + std::strerror(errno);
    return true;
  }
  Offer offer;
  if (!read_offer(c.get(), tcp_fd, &offer, deadline)) {
    up->reason = no_offer_reason(tcp_fd) + " from " + who(cred);
    return true;
  }
  if (std::string bad = offer_problem(offer); !bad.empty()) {
    refuse(c.get(), kRefused, deadline);
    up->reason = "rendezvous: " + bad;
    return true;
  }
  if (std::memcmp(&offer.tuple, &t, sizeof t) != 0) {
    refuse(c.get(), kRefused, deadline);
    up->reason = "rendezvous: offer names another connection: refused";
    return true;
  }
  stream::Engine* eng = engine_for_user(cred.uid, &up->reason);
  if (eng == nullptr) {
    refuse(c.get(), kRefused, deadline);
    return true;
  }
  try {
    up->stream =
        server_commit(c.get(), *eng, "127.0.0.1:" + std::to_string(offer.stream_port),
                      offer.client_nonce, deadline, &up->reason, -1, tcp_fd);
  } catch (const std::exception& e) {
    up->reason = std::string("upgrade failed: ") + e.what();
  }
  return true;
}

}  // namespace rdmakit::preload
