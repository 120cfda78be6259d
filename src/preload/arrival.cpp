// Descriptors that reach this process or leave it other than by accept()
// and connect() (arrival.hpp).
#include "arrival.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "adopt.hpp"
#include "conn_guard.hpp"
#include "creator.hpp"
#include "handoff.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "rendezvous.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

// A forked child gets dormant relays at fork for at most this many
// connections of its parent; beyond that, relays are made at first use.
constexpr size_t kDormantAtFork = 16;

// Calls fn(fd) for each descriptor a message passes (SCM_RIGHTS).
template <typename Fn>
void for_each_passed_fd(const msghdr* msg, Fn fn) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(msg), c)) {  // NOLINT: glibc's signature
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fn(fd);
    }
  }
}

// A TCP socket, or an AF_UNIX socket that may stand for a connection.
bool is_candidate(int fd, int* domain) {
  int type = 0;
  int proto = 0;
  socklen_t l = sizeof type;
  if (real().getsockopt(fd, SOL_SOCKET, SO_DOMAIN, domain, &l) != 0) return false;
  l = sizeof type;
  if (real().getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) != 0) return false;
  // A readiness socket is a datagram pair, a relay socket a stream pair.
  if (*domain == AF_UNIX) return type == SOCK_STREAM || type == SOCK_DGRAM;
  if (type != SOCK_STREAM) return false;
  l = sizeof proto;
  return real().getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) == 0 &&
         proto == IPPROTO_TCP;
}

struct Seen {
  dev_t dev;
  ino_t ino;
  std::shared_ptr<Pending> p;
  Entry kind;
};

// A descriptor that came from elsewhere: a loopback TCP connection is left
// pending (its first use settles it; at exec, a connect()ed end nobody
// settled yet stays on kernel TCP: creator.hpp), an AF_UNIX stream socket
// made by another process may be that process's upgraded connection.
void classify(int fd, std::vector<Seen>* seen, bool at_exec) {
  if (fd < 0 || fd >= kMaxFd || entry_of(fd) != Entry::kNone) return;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  int domain = 0;
  if (!is_candidate(fd, &domain)) return;
  for (auto& s : *seen) {
    if (s.dev == st.st_dev && s.ino == st.st_ino) {
      if (s.kind != Entry::kNone) install_pending(fd, s.p, s.kind);
      return;
    }
  }
  auto p = std::make_shared<Pending>();
  p->inherited = true;
  Entry e = Entry::kNone;
  if (domain == AF_UNIX) {
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (real().getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        cred.pid <= 0 || cred.pid == getpid()) {
      return;
    }
    p->unix_peer = cred.pid;
    e = Entry::kInherited;
  } else {
    int listening = 0;
    socklen_t l = sizeof listening;
    if (real().getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) != 0 ||
        listening != 0 || !loopback_connection(fd)) {
      return;
    }
    e = Entry::kPending;
    p->connect_side = offered_by_a_connect(fd);
    // Only stdin, stdout and stderr: the numbers stdio uses. Any other is
    // left to its first use (a shell's commands all inherit its fd 3).
    if (at_exec && fd <= 2 && p->connect_side && keep_on_kernel_at_exec(fd)) {
      seen->push_back({st.st_dev, st.st_ino, nullptr, Entry::kNone});  // its aliases too
      return;
    }
  }
  install_pending(fd, p, e);
  seen->push_back({st.st_dev, st.st_ino, std::move(p), e});
}

}  // namespace

void scan_inherited() noexcept {
  try {
    DIR* d = opendir("/proc/self/fd");
    if (d == nullptr) return;
    const int own = dirfd(d);
    std::vector<int> fds;
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (*end == '\0' && end != e->d_name && fd != own)
        fds.push_back(static_cast<int>(fd));
    }
    closedir(d);
    std::vector<Seen> seen;
    for (const int fd : fds) classify(fd, &seen, true);
    // A connect()ed end on stdin, stdout or stderr that its creator claimed
    // first: followed now (once its settle ends, a few milliseconds),
    // before the program can use it through stdio, which the hooks do not
    // see (a relay socket carries those bytes; the kernel socket would not
    // reach the stream).
    for (const auto& s : seen) {
      if (s.kind != Entry::kPending || !s.p->connect_side || s.p->fds.empty() ||
          s.p->fds.front() > 2)
        continue;
      const bool is_stdin = s.p->fds.front() == 0;
      settle(s.p->fds.front());
      // Read as stdin, perhaps through stdio (sed, awk) whose reads reach no
      // hook: its relay delivers from the start, not from a first read.
      if (is_stdin && entry_of(0) == Entry::kDormant) wake_relayed(0);
    }
  } catch (...) {
    // Out of memory at load: inherited connections stay as they are.
  }
}

void note_received(const msghdr* msg) noexcept {
  try {
    std::vector<Seen> seen;
    for_each_passed_fd(msg, [&](int fd) {
      // A new number: what the table held for it was closed behind the
      // library's back (libuv closes with a raw system call).
      forget_stale(fd);
      classify(fd, &seen, false);
    });
  } catch (...) {
    // Out of memory: the descriptors stay plain kernel sockets.
  }
}

void note_sent(const msghdr* msg) noexcept {
  for_each_passed_fd(msg, [](int fd) {
    if (auto p = pending_of(fd)) {
      p->inherited = true;
      p->sent_until_ns.store(Conn::sent_deadline(), std::memory_order_release);
    }
    if (entry_of(fd) == Entry::kConn) {
      if (auto conn = entry_conn(fd)) {
        conn->adopt_gen = ~uint64_t{0};
        conn->sent_until_ns.store(Conn::sent_deadline(), std::memory_order_release);
      }
    }
  });
}

void relay_foreign_in_child() noexcept {
  try {
    // Few connections (a session's monitor, not a server's thousands): each
    // gets a dormant relay now, while the child may still make the calls a
    // relay needs (sshd's privilege-separated child runs in a seccomp
    // sandbox that allows read and write, not socket or dup3).
    std::vector<int> foreign;
    for (int fd = 0; fd < kMaxFd && foreign.size() <= kDormantAtFork; ++fd) {
      if (entry_of(fd) == Entry::kForeign) foreign.push_back(fd);
    }
    if (foreign.empty() || foreign.size() > kDormantAtFork) return;
    std::vector<std::shared_ptr<Conn>> done;
    for (const int fd : foreign) {
      auto c = entry_conn(fd);
      if (!c || entry_of(fd) != Entry::kForeign) continue;
      std::vector<int> aliases;
      for (const int a : foreign) {
        if (entry_of(a) == Entry::kForeign && entry_conn(a) == c) aliases.push_back(a);
      }
      RelayGrant g = request_relay(c->owner, c->tcp_fd);
      if (g.granted && install_grant(aliases, g, Entry::kDormant)) {
        log_line("fork fd=%d %s path=relay owner=%d (dormant until its first read)", fd,
                 describe(kernel_socket(fd)).c_str(), static_cast<int>(c->owner));
      } else {
        if (g.wake >= 0) real().close(g.wake);
        log_line("fork fd=%d: no relay at fork (%s): relayed at first use", fd,
                 g.why.c_str());
      }
    }
  } catch (...) {
    // Out of memory: the connections are relayed at their first use.
  }
}

}  // namespace rdmakit::preload
