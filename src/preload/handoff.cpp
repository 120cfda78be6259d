#include "handoff.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "adopt.hpp"
#include "adoption.hpp"
#include "conn_guard.hpp"
#include "creator.hpp"
#include "early_send.hpp"
#include "fd_place.hpp"
#include "hook.hpp"
#include "interruption.hpp"
#include "libc.hpp"
#include "mirror.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "rendezvous.hpp"
#include "rules.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

std::mutex g_foreign_mu;  // one foreign or inherited settle at a time
uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t l = sizeof ss;
  if (real().getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &l) != 0)
    return 0;  // NOLINT
  return ntohs(ss.ss_family == AF_INET
                   ? reinterpret_cast<const sockaddr_in*>(&ss)->sin_port      // NOLINT
                   : reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);  // NOLINT
}

// Set while settle_on_kernel() settles: the connection stays on kernel
// TCP, its offer refused with this reason and wire status.
thread_local const char* t_forced_reason = nullptr;
thread_local uint32_t t_forced_status = 0;
// Set by settle_for_plain_exec(): a lock held (by a thread that did not
// survive a fork, or by an interrupted one) skips the entry rather than
// waiting inside exec.
thread_local bool t_no_wait = false;

std::string deny_reason(int fd) {
  if (!process_denied().empty()) return process_denied();
  sockaddr_storage peer{};
  socklen_t pl = sizeof peer;
  if (real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
    return {};                                                                   // NOLINT
  return connection_denied(local_port(fd), reinterpret_cast<sockaddr*>(&peer));  // NOLINT
}

// A connection this process cannot carry and whose bytes it must not see on
// kernel TCP (its peer reads a stream): every use fails as on a connection
// reset, never a silent wrong byte.
void install_dead(const std::vector<int>& aliases) {
  int pair[2];
  if (real().socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return;
  real().close(pair[1]);
  for (const int a : aliases) {
    const int fd_flags = real().fcntl(a, F_GETFD);
    (void)real().dup3(pair[0], a, (fd_flags & FD_CLOEXEC) != 0 ? O_CLOEXEC : 0);
  }
  real().close(pair[0]);
  for (const int a : aliases) (void)remove_conn(a);
}

// The connection another process carries: relayed through it, or, when it
// cannot relay, unusable here (never its bytes on kernel TCP).
void relay_or_dead(const char* side, int fd, int held_fd, pid_t owner,
                   const std::vector<int>& aliases, const std::string& where) {
  RelayGrant g = owner > 0 ? request_relay(owner, held_fd) : RelayGrant{};
  if (g.granted && install_grant(aliases, g)) {
    log_line("%s fd=%d %s path=relay owner=%d", side, fd, where.c_str(),
             static_cast<int>(owner));
    return;
  }
  log_line(
      "%s fd=%d %s path=none reason=pid %d carries the connection and cannot relay "
      "it: %s (reads end, writes fail with EPIPE)",
      side, fd, where.c_str(), static_cast<int>(owner), g.why.c_str());
  install_dead(aliases);
}

std::vector<int> aliases_of(const std::shared_ptr<Pending>& p) {
  // p->fds changes under the table lock; a snapshot through pending_of.
  std::vector<int> out;
  for (const int fd : p->fds) {
    if (pending_of(fd) == p) out.push_back(fd);
  }
  return out;
}

constexpr const char* kClosedMeanwhile =
    "the application closed the connection while it was being upgraded";

// After a rendezvous: fd still names this connection (a helper settles an
// end nobody is using, which the application may close meanwhile and its
// number be reused); *now gets the numbers that do.
bool still_held(int fd, const std::shared_ptr<Pending>& p, std::vector<int>* now) {
  *now = aliases_of(p);
  return std::find(now->begin(), now->end(), fd) != now->end();
}

// A pending connection sent away before this process adopted it: the
// descriptor may still be in flight to its receiver.
void carry_sent(int fd, const Pending& p) {
  if (auto conn = entry_conn(fd)) {
    conn->sent_until_ns.store(p.sent_until_ns.load(std::memory_order_acquire),
                              std::memory_order_release);
  }
}

// The client's end: the kernel connect done (or failed), the server's
// answer taken up within the budget, else kernel TCP. true: upgraded.
bool settle_connect(int fd, const std::shared_ptr<Pending>& p,
                    const std::string& marker) {
  const std::vector<int> aliases = aliases_of(p);
  PendingOfferPtr offer = std::move(p->offer);
  sockaddr_storage peer{};
  socklen_t pl = sizeof peer;
  // getpeername, not SO_ERROR: the application reads (and clears) that one.
  bool connected =
      real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0;  // NOLINT
  if (!connected) {
    pollfd w{fd, POLLOUT, 0};
    const int ms = static_cast<int>(config().timeout.count());
    const int r = poll_through_signals(&w, 1, ms);
    pl = sizeof peer;
    connected = r > 0 && real().getpeername(fd, reinterpret_cast<sockaddr*>(&peer),
                                            &pl) == 0;  // NOLINT
  }
  std::string where = describe(fd);
  std::string reason;
  // A connection to this process's own listener: its accepted end is
  // settled alongside (mirror.hpp), or, not accepted yet, it stays on TCP.
  std::optional<MirrorSettle> other_end;
  if (connected && offer_listener_here(*offer) && !settling_for_mirror()) {
    if (Mirror m = await_accepted_mirror(fd); !m) {
      connected = false;
      reason =
          "the listener is in this process and has not accepted the connection (waiting "
          "could be waiting for this very thread)";
    } else if (m.pending) {
      other_end.emplace(std::move(m));
    }
  }
  // Early bytes (early_send.hpp) of a connection sent away since: the
  // receiver does not know they went ahead.
  const size_t early = offer->early.size();
  if (connected && early != 0 && p->inherited.load()) {
    connected = false;
    reason = "sent to another process after its first bytes went on kernel TCP";
  }
  if (connected) {
    Upgrade up = finish_connect(std::move(offer), fd);
    std::vector<int> now;
    if (up.stream != nullptr && !still_held(fd, p, &now)) {
      up.reason = kClosedMeanwhile;
    } else if (up.stream != nullptr && adopt(fd, now, up, "connect", where, marker)) {
      carry_sent(fd, *p);
      if (p->fork_gen != fork_generation()) {
        if (auto c = entry_conn(fd)) c->kernel_copies_follow.store(true);
      }
      if (early != 0) {
        log_line(
            "connect fd=%d: its first %zu bytes went on kernel TCP before the "
            "server took the offer up (early bytes); written again first on the stream",
            fd, early);
      }
      return true;
    }
    reason = up.reason;
  } else if (reason.empty()) {
    reason = "the kernel connect did not complete";
  }
  if (!reason.empty()) {
    log_line("connect fd=%d %s path=kernel reason=%s", fd, where.c_str(), reason.c_str());
    publish_fallback(fd, "connect", reason);
  }
  for (const int a : aliases) (void)remove_conn(a);
  return false;
}

// Another holder of the connection claimed it first: this one follows how
// that holder settled it.
void follow_adoption(const char* side, int fd, const Adoption& other,
                     const std::vector<int>& aliases, const std::string& where) {
  const int pid = static_cast<int>(other.pid);
  if (other.holder == Holder::kKernel) {
    log_line(
        "%s fd=%d %s path=kernel reason=pid %d holds it too and settled it on "
        "kernel TCP",
        side, fd, where.c_str(), pid);
    for (const int a : aliases) (void)remove_conn(a);
    return;
  }
  if (other.holder == Holder::kOwned && other.alive) {
    relay_or_dead(side, fd, fd, other.pid, aliases, where);
    return;
  }
  log_line("%s fd=%d %s path=none reason=pid %d %s (reads end, writes fail with EPIPE)",
           side, fd, where.c_str(), pid,
           !other.alive ? "carried the connection and has exited"
                        : "holds it too and did not settle it within the budget");
  install_dead(aliases);
}

// The server's end: upgraded if its client offered, else kernel TCP.
// true: upgraded.
bool settle_accepted(int fd, const std::shared_ptr<Pending>& p,
                     const std::vector<int>& aliases, const std::string& where,
                     const std::string& marker) {
  // The client end is this process's too: settled alongside (mirror.hpp).
  std::optional<MirrorSettle> other_end;
  if (Mirror m = find_mirror(fd, false); m.pending) other_end.emplace(std::move(m));
  Upgrade up = t_forced_reason != nullptr
                   ? upgrade_accepted(fd, t_forced_reason, t_forced_status)
                   : upgrade_accepted(fd, deny_reason(fd));
  std::vector<int> now;
  if (up.stream != nullptr && !still_held(fd, p, &now)) {
    up.stream.reset();
    up.reason = kClosedMeanwhile;
  }
  if (up.stream != nullptr) {
    if (adopt(fd, now, up, "accept", where, marker)) {
      carry_sent(fd, *p);
      return true;
    }
  } else {
    log_line("accept fd=%d %s path=kernel reason=%s", fd, where.c_str(),
             up.reason.c_str());
    publish_fallback(fd, "accept", up.reason);
  }
  for (const int a : aliases) (void)remove_conn(a);
  return false;
}

// Without the offer, this process cannot upgrade it: it follows the
// creator's settle, or, if nobody will settle it, claims it for kernel TCP
// so that any other holder follows that.
void settle_inherited_connect(int fd, const std::shared_ptr<Pending>& p) {
  const AdoptionMarker marker = adoption_marker_of(fd, true);
  const std::vector<int> aliases = aliases_of(p);
  const std::string where = describe(fd);
  if (Adoption other; !t_no_wait && await_offer_taken(marker, fd, &other)) {
    follow_adoption("connect", fd, other, aliases, where);
    return;
  }
  // A holder settling it may take a rendezvous: wait for that, as any
  // second holder does (settle_pending); inside exec, not at all.
  const auto now = std::chrono::steady_clock::now();
  if (Adoption other;
      !claim_adoption(marker, t_no_wait ? now : now + 3 * config().timeout, &other)) {
    follow_adoption("connect", fd, other, aliases, where);
    return;
  }
  const char* reason = "connected by another process, which did not settle it";
  log_line("connect fd=%d %s path=kernel reason=%s", fd, where.c_str(), reason);
  publish_fallback(fd, "connect", reason);
  for (const int a : aliases) (void)remove_conn(a);
  mark_adoption(marker, Holder::kKernel);
}

void settle_pending(int fd, const std::shared_ptr<Pending>& p) {
  // The connect()ed end of a connection whose offer stayed with the process
  // that made it (exec, SCM_RIGHTS): that process settles it (creator.hpp).
  if (p->offer == nullptr && p->connect_side) {
    settle_inherited_connect(fd, p);
    return;
  }
  const bool client = p->offer != nullptr;
  // A connection another process may also hold (a fork, exec or SCM_RIGHTS
  // since the accept or connect): the first holder to use it settles it,
  // the others follow (adoption.hpp).
  bool shared =
      p->inherited || p->accepted_by != process_id() || p->fork_gen != fork_generation();
  // A child spawned without fork's handlers (vfork, posix_spawn: Python's
  // subprocess, Go, Java) may hold it too and have claimed it at its exec.
  if (!shared && client &&
      read_adoption(adoption_marker_of(fd, true)).holder != Holder::kNone)
    shared = true;
  const AdoptionMarker marker =
      shared ? adoption_marker_of(fd, client) : AdoptionMarker{};
  bool keep_on_kernel = false;
  if (client && !p->inherited && p->accepted_by != process_id() && !t_no_wait &&
      !marker.path.empty()) {
    Adoption other;
    const CreatorWait w = await_creator(marker, p->accepted_by, aliases_of(p), &other);
    if (w == CreatorWait::kSettled) {
      follow_adoption("connect", fd, other, aliases_of(p), describe(fd));
      return;
    }
    keep_on_kernel = w == CreatorWait::kStillHeld;
  }
  // A holder settling it may take a connect's wait and a rendezvous (a
  // budget each): followers wait for all of that; inside exec, not at all.
  const auto now = std::chrono::steady_clock::now();
  if (Adoption other;
      !claim_adoption(marker, t_no_wait ? now : now + 3 * config().timeout, &other)) {
    follow_adoption(client ? "connect" : "accept", fd, other, aliases_of(p),
                    describe(fd));
    return;
  }
  if (keep_on_kernel) {
    const char* reason =
        "its creator still holds it and did not settle it within the budget";
    log_line("connect fd=%d %s path=kernel reason=%s", fd, describe(fd).c_str(), reason);
    publish_fallback(fd, "connect", reason);
    for (const int a : aliases_of(p)) (void)remove_conn(a);
    mark_adoption(marker, Holder::kKernel);
    return;
  }
  const bool upgraded =
      client ? settle_connect(fd, p, marker.path)
             : settle_accepted(fd, p, aliases_of(p), describe(fd), marker.path);
  // Only now can a follower's relay request find the connection here.
  mark_adoption(marker, upgraded ? Holder::kOwned : Holder::kKernel);
}

void settle_inherited(int fd, const std::shared_ptr<Pending>& p) {
  const std::vector<int> aliases = aliases_of(p);
  RelayGrant g = request_relay(p->unix_peer, fd);
  if (g.granted && install_grant(aliases, g)) {
    log_line("inherited fd=%d %s path=relay owner=%d", fd,
             describe(kernel_socket(fd)).c_str(), static_cast<int>(p->unix_peer));
    return;
  }
  // A unix socket that is nobody's connection is the common case: quiet.
  if (g.why.find("not a connection of pid") == std::string::npos &&
      g.why.find("serves no relays") == std::string::npos) {
    log_line("inherited fd=%d: not relayed by pid %d: %s", fd,
             static_cast<int>(p->unix_peer), g.why.c_str());
  }
  for (const int a : aliases) (void)remove_conn(a);  // a plain unix socket
}

void settle_foreign(int fd) {
  std::unique_lock lock(g_foreign_mu, std::defer_lock);
  if (t_no_wait ? !lock.try_lock() : (lock.lock(), false)) return;
  if (entry_of(fd) != Entry::kForeign) return;
  const int tcp = kernel_socket(fd);
  struct stat mine {};
  (void)fstat(fd, &mine);
  // Every number naming the same readiness socket is an alias.
  std::vector<int> aliases;
  for (int a = 0; a < kMaxFd; ++a) {
    struct stat st {};
    if (entry_of(a) == Entry::kForeign && fstat(a, &st) == 0 &&
        st.st_ino == mine.st_ino && st.st_dev == mine.st_dev) {
      aliases.push_back(a);
    }
  }
  // The parent (or an ancestor) that upgraded it: the copy of its Conn this
  // child inherited names it.
  const auto c = entry_conn(fd);
  const pid_t owner = c ? c->owner : 0;
  const int owner_fd = c ? c->tcp_fd : -1;
  relay_or_dead("use", fd, owner_fd >= 0 ? owner_fd : fd, owner, aliases, describe(tcp));
}

}  // namespace

// A relay starts dormant: the owner delivers to it from its first read
// (find_conn), so a holder that only writes takes none of the bytes its
// owner reads.
bool install_grant(const std::vector<int>& aliases, RelayGrant& g, Entry kind) {
  int private_copy = -1;
  // The file this process's numbers name shares O_NONBLOCK with the other
  // holders' (fork, exec, SCM_RIGHTS): as this process last set it, on a
  // kernel socket not settled yet, or as its copy of the upgraded
  // connection says after a fork; else as the owner sees it (its grant).
  if (g.relay >= 0 && !aliases.empty()) {
    int nonblocking = -1;
    if (entry_of(aliases.front()) == Entry::kPending) {
      const int fl = real().fcntl(aliases.front(), F_GETFL);
      if (fl >= 0) nonblocking = (fl & O_NONBLOCK) != 0 ? 1 : 0;
    } else if (entry_of(aliases.front()) == Entry::kForeign) {
      if (const auto c = entry_conn(aliases.front()))
        nonblocking = c->nonblocking.load(std::memory_order_relaxed) ? 1 : 0;
    }
    const int fl = real().fcntl(g.relay, F_GETFL);
    if (nonblocking >= 0 && fl >= 0)
      (void)real().fcntl(g.relay, F_SETFL,
                         nonblocking != 0 ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
  }
  if (g.relay >= 0) {
    private_copy = place_high(real().fcntl(g.relay, F_DUPFD_CLOEXEC, 0));
    for (const int a : aliases) {
      const int fd_flags = real().fcntl(a, F_GETFD);
      if (real().dup3(g.relay, a, (fd_flags & FD_CLOEXEC) != 0 ? O_CLOEXEC : 0) < 0) {
        real().close(g.relay);
        real().close(g.tcp);
        if (private_copy >= 0) real().close(private_copy);
        g.why = std::string("dup3: ") + std::strerror(errno);
        return false;
      }
    }
    real().close(g.relay);
  } else if (!aliases.empty()) {
    private_copy = place_high(real().fcntl(aliases.front(), F_DUPFD_CLOEXEC, 0));
  }
  auto tcp_only = make_conn();
  tcp_only->relay_fd = private_copy;
  tcp_only->tcp_fd = g.tcp;
  tcp_only->owner = process_id();
  tcp_only->wake_fd = g.wake;
  tcp_only->relay_aliases = aliases;
  for (const int a : aliases) install_relayed(a, tcp_only, kind);
  return true;
}

bool defer_accepted(int fd) {
  if (!loopback_connection(fd)) return false;
  auto p = std::make_shared<Pending>();
  p->accepted_by = process_id();
  p->fork_gen = fork_generation();
  install_pending(fd, std::move(p), Entry::kPending);
  return true;
}

bool defer_connect(int fd, PendingOfferPtr& offer) {
  try {
    auto p = std::make_shared<Pending>();
    p->accepted_by = process_id();
    p->fork_gen = fork_generation();
    p->offer = std::move(offer);
    p->offer->mark_deferred();
    install_pending(fd, std::move(p), Entry::kPending);
    return true;
  } catch (...) {
    return false;
  }
}

void settle_before_close(int fd) {
  if (entry_of(fd) != Entry::kPending) return;
  auto p = pending_of(fd);
  if (p && p->offer && aliases_of(p).size() == 1) {
    // The answerer (early_send.hpp) may be settling it: wait for that, and
    // keep it from starting once the number is let go.
    const std::unique_lock lock(p->mu);
    p->closing = true;
    // A client that sent early bytes and closes before the server took the
    // offer up: the connection was kernel TCP all along.
    if (pending_of(fd) == p && p->offer && !p->offer->early.empty()) {
      const std::string reason = "closed before any upgrade (its " +
                                 std::to_string(p->offer->early.size()) +
                                 " early bytes went on kernel TCP)";
      log_line("connect fd=%d %s path=kernel reason=%s", fd, describe(fd).c_str(),
               reason.c_str());
      publish_fallback(fd, "connect", reason);
    }
    return;
  }
  if (!p || p->offer || p->inherited || p->accepted_by != process_id() ||
      p->fork_gen != fork_generation() || aliases_of(p).size() != 1) {
    return;
  }
  settle(fd);
}

void watch_offers_after_fork() noexcept {
  if (!any_deferred_offer()) return;  // a server's forks: nothing to scan
  for (int fd = 0; fd < kMaxFd; ++fd) {
    if (entry_of(fd) != Entry::kPending) continue;
    const auto p = pending_of(fd);
    if (!p) continue;
    // Not one a thread of this process is settling now (it moves the offer);
    // the lock is let go before the answerer may need it.
    std::unique_lock lock(p->mu, std::try_to_lock);
    const bool watch = lock.owns_lock() && p->offer && p->accepted_by == process_id() &&
                       !p->offer->listener_here;
    if (lock.owns_lock()) lock.unlock();
    if (watch) watch_offer(fd, p);
  }
}

void settle_if_pending(int fd, const std::shared_ptr<Pending>& p) {
  try {
    // Whoever holds it is settling this end (against ours): nothing to do.
    std::unique_lock lock(p->mu, std::try_to_lock);
    if (!lock.owns_lock() || p->closing || pending_of(fd) != p ||
        entry_of(fd) != Entry::kPending)
      return;
    settle_pending(fd, p);
  } catch (...) {
    (void)remove_conn(fd);
  }
}

void settle(int fd) {
  try {
    const Entry e = entry_of(fd);
    if (e == Entry::kDormant) {
      wake_relayed(fd);
      return;
    }
    if (e == Entry::kForeign) {
      settle_foreign(fd);
      return;
    }
    auto p = pending_of(fd);
    if (!p) return;
    std::unique_lock lock(p->mu, std::defer_lock);
    if (t_no_wait ? !lock.try_lock() : (lock.lock(), false)) return;
    if (pending_of(fd) != p) return;  // another thread settled it meanwhile
    if (e == Entry::kInherited) {
      std::unique_lock flock(g_foreign_mu, std::defer_lock);
      if (t_no_wait ? !flock.try_lock() : (flock.lock(), false)) return;
      settle_inherited(fd, p);
    } else {
      settle_pending(fd, p);
    }
  } catch (...) {
    // Out of memory while settling: the entry is dropped, the fd is what
    // the kernel says (a pending connection stays on kernel TCP).
    (void)remove_conn(fd);
  }
}

void settle_on_kernel(int fd, const char* why, uint32_t status) {
  t_forced_reason = why;
  t_forced_status = status;
  settle(fd);
  t_forced_reason = nullptr;
}

void settle_for_plain_exec(const char* why, int handed_fds) {
  // Only the descriptors handed to the new program (stdin, stdout, stderr
  // and systemd's LISTEN_FDS from 3 on): any other that survives the exec
  // was left open by accident, and waking its relay would let the plain
  // program take bytes its parent reads.
  std::vector<int> fds;
  for (int fd = 0; fd < 3 + handed_fds && fd < kMaxFd; ++fd) {
    const Entry e = entry_of(fd);
    if (e == Entry::kNone || e == Entry::kListener || e == Entry::kRelayed) continue;
    const int fd_flags = real().fcntl(fd, F_GETFD);
    if (fd_flags >= 0 && (fd_flags & FD_CLOEXEC) == 0) fds.push_back(fd);
  }
  t_no_wait = true;
  for (const int fd : fds) {
    switch (entry_of(fd)) {
      case Entry::kPending: {
        auto p = pending_of(fd);
        if (p && p->offer) {
          // Our offer goes with this image: withdrawn, the server stays on
          // kernel TCP at once.
          log_line("connect fd=%d %s path=kernel reason=%s", fd, describe(fd).c_str(),
                   why);
          for (const int a : aliases_of(p)) (void)remove_conn(a);
          break;
        }
        settle_on_kernel(fd, why, wire::kNotCarried);
        // Another holder carries it (it claimed it first): a relay socket,
        // delivering at once (no library in the new image to say it reads).
        if (entry_of(fd) == Entry::kDormant) wake_relayed(fd);
        break;
      }
      case Entry::kInherited:
      case Entry::kForeign:
      case Entry::kDormant:
        // A relay socket: bytes a plain program reads and writes, with no
        // library to say when it reads, so delivery starts now.
        settle(fd);
        if (entry_of(fd) == Entry::kDormant) wake_relayed(fd);
        break;
      case Entry::kConn:
        // The stream lives in this image's memory: the plain program would
        // read the readiness socket. Reads end, writes fail instead.
        log_line(
            "fd=%d %s path=none reason=an upgraded connection %s; it ends with this "
            "image (reads end, writes fail with EPIPE)",
            fd, describe(fd).c_str(), why);
        install_dead({fd});
        break;
      default: break;
    }
  }
  t_no_wait = false;
}

}  // namespace rdmakit::preload
