#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "relay.hpp"
#include "relay_holders.hpp"
#include "relay_pump.hpp"
#include "relay_wire.hpp"
#include "state.hpp"

// The owner side of relays (relay.hpp): the relay server thread, which
// grants relays and runs their pumps (relay_pump.hpp), and the connections it
// keeps open for other processes.
namespace rdmakit::preload {

namespace {

using namespace relay_wire;  // NOLINT(google-build-using-namespace)

class Server {
 public:
  bool start() {
    socklen_t len = 0;
    const sockaddr_un sa = relay_address(process_id(), &len);
    listener_ =
        place_high(real().socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    wake_ = place_high(real().eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (listener_ < 0 || wake_ < 0 ||
        bind(listener_, reinterpret_cast<const sockaddr*>(&sa), len) != 0 ||  // NOLINT
        real().listen(listener_, 64) != 0) {
      log_line(
          "relay: cannot serve relays (%s): other processes holding this "
          "process's connections cannot use them",
          std::strerror(errno));
      return false;
    }
    thread_ = rdmakit::detail::start_library_thread([this] { run(); });
    return true;
  }

  void stop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)real().write(wake_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    relays_.clear();
    parked_.clear();
    for (const auto& w : waiting_) real().close(w.fd);
    waiting_.clear();
    real().close(listener_);
    real().close(wake_);
  }

 private:
  void run() {
    const InternalScope internal;
    std::vector<pollfd> p;
    // Everything but the wait runs under the fork guard (process.hpp).
    std::shared_lock guard(fork_guard());
    while (!stop_.load()) {
      p.clear();
      p.push_back({listener_, POLLIN, 0});
      p.push_back({wake_, POLLIN, 0});
      const size_t waiting_at = p.size();
      for (const auto& w : waiting_) p.push_back({w.fd, POLLIN, 0});
      const size_t relays_at = p.size();
      for (auto& r : relays_) {
        add_poll_entries(*r, &p);
      }
      guard.unlock();
      const int ready = real().poll(p.data(), p.size(), kReviewMs);
      const int err = errno;
      guard.lock();
      if (ready < 0 && err != EINTR) break;
      // Relays first (their indexes shift when requests are taken).
      for (size_t i = 0; i < relays_.size() && relays_at + 2 + 3 * i < p.size(); ++i) {
        Relay& r = *relays_[i];
        const size_t at = relays_at + 3 * i;
        if (p[at + 2].revents != 0) read_control(r);
        if (!r.awake && r.wake_on_bytes && (p[at].revents & POLLIN) != 0) r.awake = true;
        pump(r, p[at].revents);
      }
      take_requests(p.data() + waiting_at);
      if ((p[0].revents & POLLIN) != 0) take_connection();

      const size_t before = relays_.size();
      {
        std::lock_guard lock(registry_mu_);
        std::erase_if(relays_, [](const std::unique_ptr<Relay>& r) { return r->dead; });
      }
      const auto now = std::chrono::steady_clock::now();
      if (relays_.size() != before ||
          now - last_review_ >= std::chrono::milliseconds(kReviewMs)) {
        last_review_ = now;
        review_parked();
      }
    }
  }

  // An asker's connection waits (in the poll set, never blocking the pumps)
  // until its request arrives or kRequestWaitMs passes.
  void take_connection() {
    const int s = place_high(real().accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC));
    if (s < 0) return;
    if (waiting_.size() >= kMaxRelays) {
      real().close(s);
      return;
    }
    waiting_.push_back({s, std::chrono::steady_clock::now() +
                               std::chrono::milliseconds(kRequestWaitMs)});
  }

  void take_requests(const pollfd* p) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<Waiting> still;
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (p[i].revents != 0) {
        take_request(waiting_[i].fd);
      } else if (now > waiting_[i].until) {
        real().close(waiting_[i].fd);  // a silent asker gets nothing
      } else {
        still.push_back(waiting_[i]);
      }
    }
    waiting_ = std::move(still);
  }

  void take_request(int s) {
    Message m;
    int held = -1;
    const bool ok = recv_message(s, &m, &held, 1, 0);
    Message reply;
    reply.status = kNotMine;
    struct stat st {};
    int keep = -1;
    if (ok && held >= 0 && fstat(held, &st) == 0) {
      answer(s, st, held, &reply, m.status == kDormant, &keep);
    } else {
      (void)send_message(s, reply, nullptr, 0);
    }
    if (held >= 0) real().close(held);
    if (keep < 0) real().close(s);
  }

  // A granted request's connection stays open as the relay's wake and
  // give-back channel (*keep = s).
  void answer(int s, const struct stat& st, int held, Message* reply, bool dormant,
              int* keep) {
    // An exec'd image asking with the relay socket it inherited.
    for (auto& r : relays_) {
      if (r->given_dev == st.st_dev && r->given_ino == st.st_ino) {
        reply->status = kAlreadyRelayed;
        r->wake_on_bytes = true;
        const int tcp = r->conn->tcp_fd;
        if (send_message(s, *reply, &tcp, 1)) {
          if (r->wake >= 0) real().close(r->wake);
          r->wake = *keep = s;
        }
        return;
      }
    }
    bool readiness = false;
    auto c = conn_by_inode(st.st_dev, st.st_ino, &readiness);
    if (!c) c = parked_by_inode(st.st_dev, st.st_ino);
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
    // What the asker can hold unread stays within what this side keeps.
    (void)real().setsockopt(r->so, SOL_SOCKET, SO_SNDBUF, &kRelaySocketBuffer,
                            sizeof kRelaySocketBuffer);
    struct stat given {};
    if (fstat(pair[1], &given) == 0) {
      r->given_dev = given.st_dev;
      r->given_ino = given.st_ino;
    }
    // The asker's number named a file shared with this process (fork, exec,
    // SCM_RIGHTS), whose O_NONBLOCK it shared: its relay socket has it too
    // (libpq in pg_basebackup's forked WAL receiver expects EAGAIN).
    if (c->nonblocking.load(std::memory_order_relaxed)) {
      const int fl = real().fcntl(pair[1], F_GETFL);
      if (fl >= 0) (void)real().fcntl(pair[1], F_SETFL, fl | O_NONBLOCK);
    }
    // Someone else now reads the readiness socket's state: it must be current.
    keep_readiness_current(*c);
    r->conn = std::move(c);
    reply->status = kNewRelay;
    r->conn->sent_until_ns.store(0, std::memory_order_release);  // it has arrived
    // Counted and listed before the asker has it: the owner's next write
    // must push what the asker writes first (flush), however soon after
    // the grant the asker writes.
    r->wake = s;
    r->awake = !dormant;
    r->start_counting();
    Relay* const granted = r.get();
    {
      std::lock_guard lock(registry_mu_);
      relays_.push_back(std::move(r));
    }
    const int fds[2] = {pair[1], granted->conn->tcp_fd};
    const bool sent = send_message(s, *reply, fds, 2);
    real().close(pair[1]);
    if (sent) {
      *keep = s;
    } else {
      std::lock_guard lock(registry_mu_);
      granted->wake = -1;  // the caller closes s
      granted->dead = true;
    }
  }

 public:
  // Runs on an application thread: what the relays of c have received from
  // their askers goes into the stream now (blocking on the stream's credit).
  void flush(Conn& c) {
    std::lock_guard lock(registry_mu_);
    for (auto& r : relays_) {
      if (r->conn.get() != &c) continue;
      std::lock_guard up(r->mu);
      push_written(*r);
    }
  }

  // The owner is about to read c itself: the relays whose askers are gone
  // give back what they took first, so the owner reads in order.
  void reclaim(Conn& c) {
    std::lock_guard lock(registry_mu_);
    for (auto& r : relays_) {
      if (r->conn.get() != &c) continue;
      std::lock_guard rl(r->mu);
      if (r->dead) continue;
      pollfd p{r->so, POLLIN, 0};
      if (real().poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) != 0) {
        push_written(*r);  // its last bytes first (written before it went)
        // Its end of stream after an 'h' is a shutdown of the connection.
        read_control_locked(*r);
        if (!r->asker_eof && r->asker_shut) (void)r->conn->stream->shutdown(SHUT_WR);
        r->asker_eof = r->asker_gone = true;
        take_back(*r);
        r->dead = true;
      }
    }
  }

  // Connections this process no longer names that other processes hold.
  void park(std::shared_ptr<Conn> c) {
    std::lock_guard lock(parked_mu_);
    parked_.push_back(std::move(c));
  }

  // Parked a moment ago, and no other process holds it: it closes, unless a
  // holder asked for a relay meanwhile.
  void unpark_unless_relayed(const std::shared_ptr<Conn>& c) {
    const std::lock_guard relays(registry_mu_);  // relays_ changes under it
    const std::lock_guard lock(parked_mu_);
    for (auto& r : relays_) {
      if (r->conn == c) return;
    }
    if (c->in_flight()) return;  // reviewed until it arrives or the budget ends
    std::erase(parked_, c);
  }

 private:
  std::shared_ptr<Conn> parked_by_inode(dev_t dev, ino_t ino) {
    std::lock_guard lock(parked_mu_);
    for (auto& c : parked_) {
      struct stat a {};
      struct stat b {};
      if ((fstat(c->tcp_fd, &a) == 0 && a.st_dev == dev && a.st_ino == ino) ||
          (fstat(c->stream->fd(), &b) == 0 && b.st_dev == dev && b.st_ino == ino)) {
        return c;
      }
    }
    return nullptr;
  }

  // A parked connection nobody relays or holds any more closes.
  void review_parked() {
    std::vector<std::shared_ptr<Conn>> done;
    {
      std::lock_guard lock(parked_mu_);
      std::erase_if(parked_, [&](std::shared_ptr<Conn>& c) {
        for (auto& r : relays_) {
          if (r->conn == c) return false;
        }
        if (c->in_flight() || held_elsewhere(*c)) return false;
        done.push_back(std::move(c));
        return true;
      });
    }
    done.clear();  // closes them: queued data delivered, then end of stream
  }

  std::chrono::steady_clock::time_point last_review_{};
  std::mutex registry_mu_;  // relays_ changes (the server thread) vs flush
  struct Waiting {
    int fd;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Waiting> waiting_;  // connected askers whose request has not come
  std::mutex parked_mu_;
  std::vector<std::shared_ptr<Conn>> parked_;
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

void reclaim_relays(Conn& c) {
  Server* s = nullptr;
  {
    std::lock_guard lock(g_mu);
    s = g_server;
  }
  if (s != nullptr) s->reclaim(c);
}

void flush_relays(Conn& c) {
  Server* s = nullptr;
  {
    std::lock_guard lock(g_mu);
    s = g_server;
  }
  if (s != nullptr) s->flush(c);
}

void release_conn(const std::shared_ptr<Conn>& c) {
  if (!c || c.use_count() != 1 || !c->stream || c->owner != process_id()) return;
  // What relayed processes wrote before the last close goes before the end
  // of stream, as with a kernel socket's buffer.
  if (c->relays() > 0) flush_relays(*c);
  if (c->adopt_gen == fork_generation() && c->marker.empty()) return;  // never shared
  Server* s = nullptr;
  {
    // Parked before the look at other processes (it reads /proc, which takes
    // milliseconds on a busy host): a holder that asks for a relay meanwhile,
    // a forked child at once, finds the connection.
    std::lock_guard lock(g_mu);
    s = g_server;
    if (s != nullptr) s->park(c);
  }
  const bool held = held_elsewhere(*c);
  if (s == nullptr) {
    if (held) {
      log_line(
          "close: the connection is still held by another process, but this one serves "
          "no relays: it closes now");
    }
    return;
  }
  if (held) return;
  std::lock_guard lock(g_mu);
  if (g_server == s) s->unpark_unless_relayed(c);
}

}  // namespace rdmakit::preload