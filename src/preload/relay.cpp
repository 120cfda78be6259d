#include "relay.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

constexpr uint32_t kMagic = 0x31524b52;  // "RKR1"
constexpr size_t kBuf = 64 * 1024;
// How long a request may take to arrive once its asker connected: the
// server thread also pumps the relays, so a silent asker must not hold it.
constexpr int kRequestWaitMs = 50;
constexpr int kReplyWaitMs = 2000;
constexpr size_t kMaxRelays = 1024;

enum Status : uint32_t { kNotMine = 0, kNewRelay = 1, kAlreadyRelayed = 2, kFull = 3 };

struct Message {
  uint32_t magic = kMagic;
  uint32_t status = 0;
};

sockaddr_un relay_address(pid_t pid, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  char name[48];
  const int n = std::snprintf(name, sizeof name, "rdmakit-relay-%d", static_cast<int>(pid));
  std::memcpy(sa.sun_path + 1, name, static_cast<size_t>(n));  // abstract: leading NUL
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

// One message with up to two descriptors.
bool send_message(int s, const Message& m, const int* fds, int nfds) {
  iovec v{const_cast<Message*>(&m), sizeof m};  // NOLINT: iovec is not const-correct
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  if (nfds > 0) {
    h.msg_control = ctl;
    h.msg_controllen = CMSG_SPACE(static_cast<size_t>(nfds) * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(static_cast<size_t>(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, static_cast<size_t>(nfds) * sizeof(int));
  }
  return real().sendmsg(s, &h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof m);
}

// Receives one message; every descriptor that came with it is placed high
// (close-on-exec) and returned in fds (the rest closed). -1: none.
bool recv_message(int s, Message* m, int* fds, int max_fds, int wait_ms) {
  pollfd p{s, POLLIN, 0};
  int r = 0;
  do {
    r = real().poll(&p, 1, wait_ms);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  iovec v{m, sizeof *m};
  alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr h{};
  h.msg_iov = &v;
  h.msg_iovlen = 1;
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  const ssize_t n = real().recvmsg(s, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  for (int i = 0; i < max_fds; ++i) fds[i] = -1;
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (got < max_fds) {
        fds[got++] = place_high(fd);
      } else {
        real().close(fd);
      }
    }
  }
  return n == static_cast<ssize_t>(sizeof *m) && m->magic == kMagic &&
         (h.msg_flags & MSG_CTRUNC) == 0;
}

struct Relay {
  std::shared_ptr<Conn> conn;
  int so = -1;  // the owner's end of the pair
  dev_t given_dev = 0;
  ino_t given_ino = 0;  // the end given away (an exec'd image asks with it)
  std::unique_ptr<char[]> up{new char[kBuf]};    // asker -> stream
  std::unique_ptr<char[]> down{new char[kBuf]};  // stream -> asker
  size_t up_len = 0, up_off = 0, down_len = 0, down_off = 0;
  bool asker_eof = false;   // the asker shut down writing
  bool asker_gone = false;  // every copy of the asker's end is closed
  bool stream_eof = false;
  bool dead = false;
  ~Relay() {
    if (so >= 0) real().close(so);
  }
};

class Server {
 public:
  bool start() {
    socklen_t len = 0;
    const sockaddr_un sa = relay_address(process_id(), &len);
    listener_ = place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    wake_ = place_high(real().eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (listener_ < 0 || wake_ < 0 ||
        bind(listener_, reinterpret_cast<const sockaddr*>(&sa), len) != 0 ||  // NOLINT
        real().listen(listener_, 64) != 0) {
      log_line("relay: cannot serve relays (%s): other processes holding this "
               "process's connections cannot use them",
               std::strerror(errno));
      return false;
    }
    thread_ = std::thread([this] { run(); });
    return true;
  }

  void stop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)real().write(wake_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    relays_.clear();
    real().close(listener_);
    real().close(wake_);
  }

 private:
  void run() {
    const InternalScope internal;
    std::vector<pollfd> p;
    while (!stop_.load()) {
      p.clear();
      p.push_back({listener_, POLLIN, 0});
      p.push_back({wake_, POLLIN, 0});
      for (auto& r : relays_) {
        short so_ev = 0;
        short st_ev = 0;
        if (!r->asker_eof && r->up_len == 0) so_ev |= POLLIN;
        if (r->down_len > r->down_off) so_ev |= POLLOUT;
        if (!r->stream_eof && r->down_len == 0) st_ev |= POLLIN;
        if (r->up_len > r->up_off) st_ev |= POLLOUT;
        p.push_back({r->so, so_ev, 0});
        p.push_back({r->conn->stream->fd(), st_ev, 0});
      }
      if (real().poll(p.data(), p.size(), 1000) < 0 && errno != EINTR) break;
      if ((p[0].revents & POLLIN) != 0) take_request();
      for (size_t i = 0; i < relays_.size() && 2 + 2 * i < p.size(); ++i) {
        pump(*relays_[i], p[2 + 2 * i].revents);
      }
      std::erase_if(relays_, [](const std::unique_ptr<Relay>& r) { return r->dead; });
    }
  }

  void take_request() {
    const int s = place_high(real().accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC));
    if (s < 0) return;
    Message m;
    int held = -1;
    const bool ok = recv_message(s, &m, &held, 1, kRequestWaitMs);
    Message reply;
    reply.status = kNotMine;
    struct stat st {};
    if (ok && held >= 0 && fstat(held, &st) == 0) {
      answer(s, st, held, &reply);
    } else {
      (void)send_message(s, reply, nullptr, 0);
    }
    if (held >= 0) real().close(held);
    real().close(s);
  }

  void answer(int s, const struct stat& st, int held, Message* reply) {
    // An exec'd image asking with the relay socket it inherited.
    for (auto& r : relays_) {
      if (r->given_dev == st.st_dev && r->given_ino == st.st_ino) {
        reply->status = kAlreadyRelayed;
        const int tcp = r->conn->tcp_fd;
        (void)send_message(s, *reply, &tcp, 1);
        return;
      }
    }
    bool readiness = false;
    auto c = conn_by_inode(st.st_dev, st.st_ino, &readiness);
    (void)held;
    if (!c) {
      (void)send_message(s, *reply, nullptr, 0);
      return;
    }
    int pair[2] = {-1, -1};
    if (relays_.size() >= kMaxRelays ||
        real().socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      reply->status = kFull;
      (void)send_message(s, *reply, nullptr, 0);
      return;
    }
    auto r = std::make_unique<Relay>();
    r->so = place_high(pair[0]);
    pair[1] = place_high(pair[1]);
    (void)real().fcntl(r->so, F_SETFL, O_NONBLOCK);
    struct stat given {};
    if (fstat(pair[1], &given) == 0) {
      r->given_dev = given.st_dev;
      r->given_ino = given.st_ino;
    }
    // Someone else now reads the readiness socket's state: it must be current.
    keep_readiness_current(*c);
    r->conn = std::move(c);
    reply->status = kNewRelay;
    const int fds[2] = {pair[1], r->conn->tcp_fd};
    const bool sent = send_message(s, *reply, fds, 2);
    real().close(pair[1]);
    if (sent) relays_.push_back(std::move(r));
  }

  static void pump(Relay& r, short so_rev) {
    stream::Stream& st = *r.conn->stream;
    // Asker -> stream.
    if (!r.asker_eof && r.up_len == 0 && (so_rev & (POLLIN | POLLHUP | POLLERR)) != 0) {
      const ssize_t n = real().recv(r.so, r.up.get(), kBuf, MSG_DONTWAIT);
      if (n > 0) {
        r.up_len = static_cast<size_t>(n);
        r.up_off = 0;
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        r.asker_eof = true;
        // A shutdown(SHUT_WR) of the asker's copy leaves its read side open
        // (no POLLHUP): that is a half close of the connection. A close is
        // not: other copies of the connection may still write.
        r.asker_gone = (so_rev & POLLHUP) != 0 || n < 0;
        if (!r.asker_gone) (void)st.shutdown(SHUT_WR);
      }
    }
    if (r.up_len > r.up_off) {
      const ssize_t w = st.write(r.up.get() + r.up_off, r.up_len - r.up_off,
                                 stream::Stream::kDontWait);
      if (w > 0) r.up_off += static_cast<size_t>(w);
      if (w < 0 && w != -EAGAIN) r.dead = true;  // the stream failed: nothing to carry
      if (r.up_off == r.up_len) r.up_len = r.up_off = 0;
    }
    // Stream -> asker.
    if (!r.stream_eof && r.down_len == 0) {
      const ssize_t n = st.read(r.down.get(), kBuf, stream::Stream::kDontWait);
      if (n > 0) {
        r.down_len = static_cast<size_t>(n);
        r.down_off = 0;
      } else if (n == 0 || n != -EAGAIN) {
        r.stream_eof = true;
        (void)real().shutdown(r.so, SHUT_WR);
      }
    }
    if (r.down_len > r.down_off) {
      const ssize_t w = real().send(r.so, r.down.get() + r.down_off, r.down_len - r.down_off,
                                    MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) r.down_off += static_cast<size_t>(w);
      if (w < 0 && errno != EAGAIN && errno != EINTR) r.asker_gone = true;
      if (r.down_off == r.down_len) r.down_len = r.down_off = 0;
    }
    if (r.asker_gone && r.up_len == 0) r.dead = true;
    if (r.asker_eof && r.stream_eof && r.up_len == 0 && r.down_len == 0) r.dead = true;
  }

  int listener_ = -1;
  int wake_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::unique_ptr<Relay>> relays_;  // the server thread's own
};

std::mutex g_mu;
Server* g_server = nullptr;  // leaked in a forked child
bool g_tried = false;

}  // namespace

void ensure_relay_server() {
  std::lock_guard lock(g_mu);
  if (g_tried) return;
  g_tried = true;
  auto* s = new Server();  // NOLINT: lives until exit
  if (s->start()) {
    g_server = s;
  } else {
    delete s;  // NOLINT
  }
}

void stop_relay_server() {
  std::lock_guard lock(g_mu);
  if (g_server != nullptr) g_server->stop();
  g_server = nullptr;
}

void forget_relay_server_in_child() {
  g_server = nullptr;  // its thread is the parent's; the object is leaked
  g_tried = false;
  new (&g_mu) std::mutex();
}

RelayGrant request_relay(pid_t owner, int held_fd) {
  RelayGrant g;
  const InternalScope internal;
  const int s = place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s < 0) {
    g.why = std::string("relay socket: ") + std::strerror(errno);
    return g;
  }
  socklen_t len = 0;
  const sockaddr_un sa = relay_address(owner, &len);
  if (real().connect(s, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {  // NOLINT
    g.why = "pid " + std::to_string(owner) + " serves no relays (" +
            std::strerror(errno) + ")";
    real().close(s);
    return g;
  }
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (real().getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
      cred.pid != owner) {
    g.why = "relay socket of pid " + std::to_string(owner) + " is served by pid " +
            std::to_string(cred.pid) + ": refused";
    real().close(s);
    return g;
  }
  Message m;
  Message reply;
  int fds[2] = {-1, -1};
  if (!send_message(s, m, &held_fd, 1) || !recv_message(s, &reply, fds, 2, kReplyWaitMs)) {
    g.why = "pid " + std::to_string(owner) + " did not answer the relay request";
  } else if (reply.status == kNewRelay && fds[0] >= 0 && fds[1] >= 0) {
    g.granted = true;
    g.relay = fds[0];
    g.tcp = fds[1];
    fds[0] = fds[1] = -1;
  } else if (reply.status == kAlreadyRelayed && fds[0] >= 0) {
    g.granted = true;
    g.tcp = fds[0];
    fds[0] = -1;
  } else {
    g.why = reply.status == kFull ? "pid " + std::to_string(owner) + " relays too many connections"
                                  : "not a connection of pid " + std::to_string(owner);
  }
  for (const int fd : fds) {
    if (fd >= 0) real().close(fd);
  }
  real().close(s);
  return g;
}

}  // namespace rdmakit::preload
