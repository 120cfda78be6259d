#include "state.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "handoff.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "relay.hpp"
#include "rendezvous.hpp"
#include "stat.hpp"

namespace rdmakit::preload {

std::atomic<uintptr_t> g_fd_word[kMaxFd];

namespace {

// Directory private to this uid: created 0700, and refused if it is a
// symlink, not ours or open to group/others (another user could plant or
// read rendezvous sockets there).
std::string private_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return "cannot create " + path + ": " + std::strerror(errno);
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0)
    return "cannot stat " + path + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return path + " is not a directory";
  if (st.st_uid != geteuid()) {
    return path + " belongs to uid " + std::to_string(st.st_uid) + ", not " +
           std::to_string(geteuid());
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", st.st_mode & 0777);
    return path + " has mode " + mode + " (must be 0700)";
  }
  return {};
}

int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) return def;
  return n;
}

Config load_config() {
  Config c;
  c.timeout =
      std::chrono::milliseconds(env_int("RDMAKIT_PRELOAD_TIMEOUT_MS", 5000, 1, 60000));
  c.busy_poll = std::chrono::microseconds(
      env_int("RDMAKIT_PRELOAD_BUSY_POLL_US", kDefaultBusyPollUs, 0, 1000000));
  // RDMAKIT_PRELOAD_RING_KB sets both paths.
  const int64_t ring_kb = env_int("RDMAKIT_PRELOAD_RING_KB", 0, 4, 2048);
  c.shm_ring_bytes =
      static_cast<uint32_t>((ring_kb != 0 ? ring_kb : kDefaultShmRingKb) * 1024);
  c.remote_ring_bytes =
      static_cast<uint32_t>((ring_kb != 0 ? ring_kb : kDefaultRemoteRingKb) * 1024);
  const char* stats = std::getenv("RDMAKIT_PRELOAD_STATS");
  c.stats = stats != nullptr && std::strcmp(stats, "0") != 0 && *stats != '\0';
  if (const char* log = std::getenv("RDMAKIT_PRELOAD_LOG");
      log != nullptr && *log != '\0') {
    c.log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  std::string base;
  if (const char* d = std::getenv("RDMAKIT_PRELOAD_DIR"); d != nullptr && *d != '\0') {
    base = d;
  } else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x == '/') {
    base = std::string(x) + "/rdmakit";
  } else {
    base = "/tmp/rdmakit-" + std::to_string(geteuid());
  }
  c.dir_problem = private_dir(base);
  if (c.dir_problem.empty()) {
    // One subdirectory per network namespace: the same 4-tuple in two
    // namespaces names two different connections.
    struct stat ns {};
    const auto ino = stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
    c.dir = base + "/net-" + std::to_string(ino);
    c.dir_problem = private_dir(c.dir);
  }
  return c;
}

// The control path's side of the table (under mu); the entries themselves
// are g_fd_word.
struct Table {
  std::mutex mu;
  std::shared_ptr<Conn> conns[kMaxFd];
  std::shared_ptr<Pending> pendings[kMaxFd];
  uint16_t ports[kMaxFd] = {};
};

// Zero at load, without a constructor run or a page touched (constinit): a
// slot's pages are written when a connection first uses them, so no call
// pays for the whole table. Never destroyed: a forked child or a late hook
// may still look at it.
union TableStorage {
  Table t;
  constexpr TableStorage() : t() {}
  ~TableStorage() {}  // NOLINT(modernize-use-equals-default): must not destroy t
};
constinit TableStorage g_table;

Table& table() { return g_table.t; }

Entry kind(int fd) noexcept {
  return entry_of_word(g_fd_word[fd].load(std::memory_order_acquire));
}

static_assert(alignof(Conn) >= kConnWord &&
              static_cast<int>(Entry::kDormant) < kConnWord);

// Table lock held (or a forked child's only thread). A kConn entry's word is
// its Conn, published after the table's reference to it (conns[fd]) and
// withdrawn before that reference goes: seq_cst, against ConnGuard's
// publish-then-check.
void set_kind(int fd, Entry e) noexcept {
  Conn* c = e == Entry::kConn ? table().conns[fd].get() : nullptr;
  const uintptr_t w = e != Entry::kConn ? static_cast<uintptr_t>(e)
                      : c != nullptr    ? reinterpret_cast<uintptr_t>(c)
                                        : 0;
  g_fd_word[fd].store(w, std::memory_order_seq_cst);
}

std::atomic<uint64_t> g_fork_gen{0};
// Entries whose first use must settle them: kPending, kInherited, kForeign
// and kDormant. A wait whose fds are all plain skips every lookup while it is 0.
std::atomic<int> g_pending{0};

// Entries counted in g_pending by their kind (the others by their Pending).
bool settled_by_use(Entry e) { return e == Entry::kForeign || e == Entry::kDormant; }

// Table lock held, before fd's kind changes: fd's pending alias (if any)
// is forgotten.
void drop_pending_locked(int fd) {
  Table& t = table();
  if (settled_by_use(kind(fd))) g_pending.fetch_sub(1, std::memory_order_relaxed);
  if (auto& p = t.pendings[fd]) {
    std::erase(p->fds, fd);
    p.reset();
    g_pending.fetch_sub(1, std::memory_order_relaxed);
  }
}

std::atomic<int> g_shm_count{0};
std::atomic<int> g_remote_count{0};
std::atomic<int> g_kernel_count{0};

}  // namespace

const Config& config() {
  static const Config* c = new Config(load_config());
  return *c;
}

Conn::~Conn() {
  if (owner != process_id()) return;  // a child's copy: never touch the parent's stream
  // The kernel resets (RST) when a socket is closed with unread bytes or
  // with SO_LINGER {1, 0} (stored on the kernel socket by setsockopt).
  if (stream) {
    linger lg{};
    socklen_t len = sizeof lg;
    const bool linger0 =
        tcp_fd >= 0 && real().getsockopt(tcp_fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 &&
        lg.l_onoff != 0 && lg.l_linger == 0;
    if (linger0 || stream->available() > 0) (void)stream->abort();
  }
  stream.reset();  // close(): delivers what is queued, then FIN
  if (tcp_fd >= 0) real().close(tcp_fd);
  if (!marker.empty()) unlink(marker.c_str());
  stats::release(stat_slot);
}

namespace {
int64_t steady_ns(std::chrono::steady_clock::time_point t) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch())
      .count();
}
}  // namespace

int64_t Conn::sent_deadline() noexcept {
  return steady_ns(std::chrono::steady_clock::now() + config().timeout);
}

bool Conn::in_flight() const noexcept {
  const int64_t until = sent_until_ns.load(std::memory_order_acquire);
  return until != 0 && steady_ns(std::chrono::steady_clock::now()) < until;
}

namespace {
std::shared_ptr<Conn> conn_locked(int fd) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  return kind(fd) == Entry::kConn ? t.conns[fd] : nullptr;
}
}  // namespace

std::shared_ptr<Conn> find_conn(int fd, bool reads) {
  const Entry e = entry_of(fd);
  if (e == Entry::kConn) return conn_locked(fd);
  if (e == Entry::kDormant) {
    if (reads) wake_relayed(fd);
    return nullptr;
  }
  if (!settles_first(fd)) return nullptr;
  settle(fd);
  const Entry now = entry_of(fd);
  if (now == Entry::kDormant && reads) wake_relayed(fd);
  return now == Entry::kConn ? conn_locked(fd) : nullptr;
}

std::shared_ptr<Conn> meta_conn(int fd) {
  if (settles_first(fd, /*meta=*/true)) settle(fd);
  return entry_of(fd) == Entry::kConn ? conn_locked(fd) : nullptr;
}

int kernel_socket(int fd) {
  const Entry e = entry_of(fd);
  if (e != Entry::kConn && e != Entry::kRelayed && e != Entry::kForeign &&
      e != Entry::kDormant) {
    return fd;
  }
  Table& t = table();
  std::lock_guard lock(t.mu);
  const auto& c = t.conns[fd];
  return c && c->tcp_fd >= 0 ? c->tcp_fd : fd;
}

std::shared_ptr<Conn> entry_conn(int fd) {
  if (fd < 0 || fd >= kMaxFd) return nullptr;
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.conns[fd];
}

namespace {
// fd names conn now, as an entry of kind e; the Conn it named before is
// released after the table lock.
void put_conn(int fd, std::shared_ptr<Conn> conn, Entry e) {
  Table& t = table();
  std::shared_ptr<Conn> old;
  {
    std::lock_guard lock(t.mu);
    drop_pending_locked(fd);
    old = std::move(t.conns[fd]);
    t.conns[fd] = std::move(conn);
    set_kind(fd, e);
    if (settled_by_use(e)) g_pending.fetch_add(1, std::memory_order_relaxed);
  }
}
}  // namespace

void install_conn(int fd, std::shared_ptr<Conn> conn) {
  put_conn(fd, std::move(conn), Entry::kConn);
}

void wake_relayed(int fd) {
  const auto c = entry_conn(fd);
  if (!c) return;
  Table& t = table();
  {
    std::lock_guard lock(t.mu);
    if (kind(fd) != Entry::kDormant || t.conns[fd] != c) return;  // woken already
    // Every alias, those made by dup2 after the fork included: none stays
    // dormant to wake it again.
    for (int a = 0; a < kMaxFd; ++a) {
      if (kind(a) == Entry::kDormant && t.conns[a] == c) {
        set_kind(a, Entry::kRelayed);
        g_pending.fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }
  const int w = c->wake_fd.load();
  if (w >= 0) (void)write_wake(w, "w", 1);  // a write: sandboxed children may make it
}

void install_relayed(int fd, std::shared_ptr<Conn> tcp_only, Entry e) {
  put_conn(fd, std::move(tcp_only), e);
}

void install_pending(int fd, std::shared_ptr<Pending> p, Entry e) {
  if (fd < 0 || fd >= kMaxFd) return;
  Table& t = table();
  std::shared_ptr<Conn> old;
  {
    std::lock_guard lock(t.mu);
    drop_pending_locked(fd);
    old = std::move(t.conns[fd]);
    p->fds.push_back(fd);
    t.pendings[fd] = std::move(p);
    g_pending.fetch_add(1, std::memory_order_relaxed);
    set_kind(fd, e);
  }
}

std::shared_ptr<Pending> pending_of(int fd) {
  const Entry e = entry_of(fd);
  if (e != Entry::kPending && e != Entry::kInherited) return nullptr;
  Table& t = table();
  std::lock_guard lock(t.mu);
  return t.pendings[fd];
}

void copy_entry(int oldfd, int newfd) {
  if (oldfd < 0 || oldfd >= kMaxFd || newfd < 0 || newfd >= kMaxFd) return;
  Table& t = table();
  std::shared_ptr<Conn> old;
  std::lock_guard lock(t.mu);
  const Entry e = kind(oldfd);
  if (e == Entry::kNone || e == Entry::kListener) return;
  drop_pending_locked(newfd);
  old = std::move(t.conns[newfd]);
  if (e == Entry::kPending || e == Entry::kInherited) {
    auto p = t.pendings[oldfd];
    if (!p) {
      set_kind(newfd, Entry::kNone);
      return;
    }
    p->fds.push_back(newfd);
    t.pendings[newfd] = std::move(p);
    g_pending.fetch_add(1, std::memory_order_relaxed);
  } else {
    t.conns[newfd] = t.conns[oldfd];
    if (settled_by_use(e)) g_pending.fetch_add(1, std::memory_order_relaxed);
  }
  set_kind(newfd, e);
}

std::shared_ptr<Conn> remove_conn(int fd) {
  const Entry e = entry_of(fd);
  if (e == Entry::kNone || e == Entry::kListener) return nullptr;
  Table& t = table();
  std::lock_guard lock(t.mu);
  drop_pending_locked(fd);
  set_kind(fd, Entry::kNone);
  return std::move(t.conns[fd]);
}

std::shared_ptr<Conn> conn_by_inode(uint64_t dev, uint64_t ino, bool* readiness) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  for (int fd = 0; fd < kMaxFd; ++fd) {
    if (kind(fd) != Entry::kConn) continue;
    const auto& c = t.conns[fd];
    if (!c || !c->stream || c->owner != process_id()) continue;
    struct stat st {};
    if (c->tcp_fd >= 0 && fstat(c->tcp_fd, &st) == 0 && st.st_dev == dev &&
        st.st_ino == ino) {
      *readiness = false;
      return c;
    }
    const int ready = c->stream->fd();
    if (ready >= 0 && fstat(ready, &st) == 0 && st.st_dev == dev && st.st_ino == ino) {
      *readiness = true;
      return c;
    }
  }
  return nullptr;
}

uint64_t fork_generation() noexcept { return g_fork_gen.load(std::memory_order_relaxed); }

bool any_pending() noexcept { return g_pending.load(std::memory_order_relaxed) > 0; }

namespace {
std::atomic<int> g_pushback{0};
}  // namespace

bool any_pushback() noexcept { return g_pushback.load(std::memory_order_acquire) > 0; }
void count_pushback(int delta) noexcept {
  g_pushback.fetch_add(delta, std::memory_order_acq_rel);
}

bool is_listener(int fd) noexcept { return entry_of(fd) == Entry::kListener; }

void add_listener(int fd, uint16_t port) {
  if (fd < 0 || fd >= kMaxFd) return;
  Table& t = table();
  std::lock_guard lock(t.mu);
  drop_pending_locked(fd);
  t.ports[fd] = port;
  set_kind(fd, Entry::kListener);
}

uint16_t listener_port(int fd) {
  if (!is_listener(fd)) return 0;
  Table& t = table();
  std::lock_guard lock(t.mu);
  return entry_of(fd) == Entry::kListener ? t.ports[fd] : 0;
}

void remove_listener(int fd) {
  if (!is_listener(fd)) return;
  Table& t = table();
  uint16_t port = 0;
  {
    std::lock_guard lock(t.mu);
    set_kind(fd, Entry::kNone);
    port = t.ports[fd];
  }
  unregister_listener(port);
}

void lock_table_for_fork() {
  g_fork_gen.fetch_add(1, std::memory_order_relaxed);
  table().mu.lock();
}
void unlock_table_after_fork() { table().mu.unlock(); }

void disown_all_in_child() {
  // The child has copies of the parent's connections; their destructors
  // must never run here (they would send FIN on the parent's streams).
  Table& t = table();
  for (int fd = 0; fd < kMaxFd; ++fd) {
    auto& c = t.conns[fd];
    if (c) new std::shared_ptr<Conn>(c);  // NOLINT: deliberately leaked
    if (kind(fd) == Entry::kConn) {
      set_kind(fd, Entry::kForeign);
      g_pending.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

namespace {
std::vector<std::shared_ptr<Conn>> take_conns(Entry e, Entry also = Entry::kNone) {
  std::vector<std::shared_ptr<Conn>> out;
  Table& t = table();
  std::lock_guard lock(t.mu);
  for (int fd = 0; fd < kMaxFd; ++fd) {
    if (const Entry k = kind(fd); k == e || (k == also && also != Entry::kNone)) {
      if (settled_by_use(k)) g_pending.fetch_sub(1, std::memory_order_relaxed);
      set_kind(fd, Entry::kNone);
      out.push_back(std::move(t.conns[fd]));
    }
  }
  return out;
}
}  // namespace

std::vector<std::shared_ptr<Conn>> take_relayed_conns() {
  // A dormant one too: an exec'd image re-asks dormant for a relay its
  // previous image had started.
  return take_conns(Entry::kRelayed, Entry::kDormant);
}

std::vector<std::shared_ptr<Conn>> take_all_conns() { return take_conns(Entry::kConn); }

void log_line(const char* fmt, ...) {
  const Config& c = config();
  if (!c.stats && c.log_fd < 0) return;
  char buf[768];
  int n = std::snprintf(buf, sizeof buf,
                        "rdmakit-preload[%d %s]: ", static_cast<int>(getpid()),
                        program_name());
  va_list ap;
  va_start(ap, fmt);
  n += std::vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  if (n > static_cast<int>(sizeof buf) - 2) n = static_cast<int>(sizeof buf) - 2;
  buf[n++] = '\n';
  if (c.stats) (void)real().write(2, buf, static_cast<size_t>(n));
  if (c.log_fd >= 0) (void)real().write(c.log_fd, buf, static_cast<size_t>(n));
}

void count_path(bool accelerated, bool remote) noexcept {
  (accelerated ? (remote ? g_remote_count : g_shm_count) : g_kernel_count)
      .fetch_add(1, std::memory_order_relaxed);
}

bool any_upgraded() noexcept {
  return g_shm_count.load(std::memory_order_relaxed) > 0 ||
         g_remote_count.load(std::memory_order_relaxed) > 0;
}

void reset_counts_in_child() {
  g_shm_count = 0;
  g_remote_count = 0;
  g_kernel_count = 0;
}

void log_summary() {
  const int shm = g_shm_count.load();
  const int remote = g_remote_count.load();
  const int kernel = g_kernel_count.load();
  if (shm + remote + kernel > 0) {
    log_line("summary connections shm=%d remote=%d kernel=%d busy_poll_us=%lld", shm,
             remote, kernel, static_cast<long long>(config().busy_poll.count()));
  }
}

std::string endpoint(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  char out[INET6_ADDRSTRLEN + 16];
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);  // NOLINT
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    std::snprintf(out, sizeof out, "%s:%u", host, ntohs(in->sin_port));
    return out;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);  // NOLINT
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    std::snprintf(out, sizeof out, "[%s]:%u", host, ntohs(in6->sin6_port));
    return out;
  }
  return "?";
}

}  // namespace rdmakit::preload
