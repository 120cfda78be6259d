#pragma once
// Process-wide state of the preload library: configuration (read from the
// environment on first use), the fd table of upgraded connections, the
// stream engine (created on the first upgrade), and the connection log.
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rdmakit/stream/stream.hpp"
#include "rendezvous.hpp"
#include "stat_format.hpp"

namespace rdmakit::preload {

// Default spin budget of one wait before it sleeps in the kernel: long enough
// to catch a reply on a fast path (a few us), short enough that an idle
// program sleeps at once (each wait spins at most this long, then sleeps
// with the progress thread armed on the completion queue).
constexpr int64_t kDefaultBusyPollUs = 50;
constexpr int64_t kDefaultShmRingKb = 2048;
constexpr int64_t kDefaultRemoteRingKb = 256;

struct Config {
  std::string dir;          // private rendezvous directory (per uid, per netns)
  std::string dir_problem;  // why dir is unusable ("" = usable)
  std::chrono::milliseconds timeout{5000};  // rendezvous budget per connection
  std::chrono::microseconds busy_poll{kDefaultBusyPollUs};  // spin before a wait sleeps
  // Each stream's receive ring and send buffer, per path. shm: large, as its
  // pages are allocated on first touch and a request/response stream keeps
  // to the first ones (ring rewind), so only a streaming connection pays for
  // it; verbs/tcp: pinned (verbs) and touched as a whole, so smaller.
  uint32_t shm_ring_bytes = kDefaultShmRingKb * 1024;
  uint32_t remote_ring_bytes = kDefaultRemoteRingKb * 1024;
  bool stats = false;  // per-connection lines and a summary on stderr
  int log_fd = -1;     // RDMAKIT_PRELOAD_LOG: the same lines, appended to a file
};

// First call reads the environment and prepares the directory; later calls
// return the same object. Never called on the pass-through path.
const Config& config();

// One upgraded connection: an open file description shared by every fd that
// dup() made from it.
struct Conn {
  std::unique_ptr<stream::Stream> stream;
  int tcp_fd = -1;      // the kernel TCP socket, kept for the kernel's view
  bool remote = false;  // on the cross-host engine (not shm)
  pid_t owner = 0;      // process that upgraded it; a forked child leaves it alone
  std::atomic<bool> nonblocking{false};
  std::atomic<int64_t> rcv_timeout_us{0};
  std::atomic<int64_t> snd_timeout_us{0};
  std::atomic<bool> foreign_logged{false};  // a fork child's use, logged once
  // The stream's error was reported (conn_io.hpp take_stream_error).
  std::atomic<bool> error_reported{false};
  // Work besides the stream that the owner's reads and writes do first, in
  // one word so that the data path tests it once (0 for almost every
  // connection): relays of this connection to other processes (relay.hpp:
  // a write first pushes what they have already written, a read first
  // reclaims from those that are gone), and bytes given back (pushback).
  std::atomic<uint32_t> detours{0};
  static constexpr uint32_t kPushback = 1;
  static constexpr uint32_t kRelay = 2;  // per relay
  int relays() const noexcept {
    return static_cast<int>(detours.load(std::memory_order_acquire) / kRelay);
  }
  void relay_started() noexcept { detours.fetch_add(kRelay, std::memory_order_acq_rel); }
  void relay_ended() noexcept { detours.fetch_sub(kRelay, std::memory_order_acq_rel); }
  bool has_pushback() const noexcept {
    return (detours.load(std::memory_order_acquire) & kPushback) != 0;
  }
  // Sets or clears the pushback mark (under pushback_mu); whether it was set.
  bool mark_pushback(bool on) noexcept {
    const uint32_t was = on ? detours.fetch_or(kPushback, std::memory_order_acq_rel)
                            : detours.fetch_and(~kPushback, std::memory_order_acq_rel);
    return (was & kPushback) != 0;
  }
  // Its slot in the published statistics (stat.hpp); nullptr: not listed.
  stats::Slot* stat_slot = nullptr;
  // Lazy readiness (epoll_set.hpp): lazy and epoll_set under lazy_mu.
  std::mutex lazy_mu;
  std::atomic<bool> lazy{false};   // Stream::set_lazy_readiness(true) is in force
  int epoll_set = -1;              // the one epoll set it is registered in; -1 none
  std::atomic<bool> eager{false};  // watched by the kernel elsewhere: never lazy
  // The adoption marker (rendezvous.hpp) other holders of the connection
  // find it by; removed with the connection.
  std::string marker;
  // kDormant: the wake channel, and the fds that name the connection.
  std::atomic<int> wake_fd{-1};
  std::vector<int> relay_aliases;
  // kRelayed: a private copy of the relay socket, to give the owner back
  // what arrived but was never read when this process lets go.
  int relay_fd = -1;
  // Owner: bytes a relayed process gave back unread; they come before the
  // stream's for the next reader.
  std::mutex pushback_mu;
  std::string pushback;
  // fork_generation() when it was upgraded: a later fork may have copied it.
  uint64_t adopt_gen = 0;
  // connect()ed, then forked before this process upgraded it: other
  // processes may hold copies of the kernel socket and be relayed at their
  // first use, so those copies keep it open here too (relay_holders.hpp).
  std::atomic<bool> kernel_copies_follow{false};
  // Sent over a unix socket (SCM_RIGHTS) and not yet asked for by a relay:
  // until then (steady clock, ns; 0 none) the descriptor may be in flight,
  // held by no process's table, so closing this process's copy must not
  // end the connection (relay_server.cpp).
  std::atomic<int64_t> sent_until_ns{0};
  bool in_flight() const noexcept;
  // Marks it sent now (note_sent), for the rendezvous budget.
  static int64_t sent_deadline() noexcept;
  ~Conn();
};

constexpr int kMaxFd = 1 << 16;

// What the fd table holds for an fd number (docs/preload.md, "Process
// shapes"). Only kConn carries a stream in this process.
enum class Entry : uint8_t {
  kNone = 0,
  kConn = 1,      // upgraded by this process
  kListener = 2,  // a TCP listener this process registered
  // An accepted (or inherited, or received) loopback TCP connection no
  // process has used yet: its first use, in whichever process makes it,
  // adopts it (upgrade), relays it to the process that did, or leaves it on
  // kernel TCP.
  kPending = 3,
  // An AF_UNIX socket that came across exec or SCM_RIGHTS: perhaps another
  // process's upgraded connection (its readiness socket or a relay socket).
  kInherited = 4,
  // A relay socket to the process that carries the connection; the entry's
  // Conn holds only the kernel TCP socket (names and options).
  kRelayed = 5,
  // A forked child's copy of its parent's upgraded connection.
  kForeign = 6,
  // kRelayed, set up at fork for a child that may never use it: the owner
  // sends nothing until its first use writes a byte to Conn::wake_fd (a
  // write, which sandboxed children such as sshd's may still make).
  kDormant = 7,
};

// The fd table's lock-free face, read first by every hook: one word per
// fd. 0: nothing the library tracks (libc at once); at least kConnWord: the
// Conn* of an upgraded connection this process carries (Entry::kConn),
// which a hook uses under a ConnGuard (conn_guard.hpp); otherwise the fd's
// Entry. Written under the table lock, after the table's own reference.
constexpr uintptr_t kConnWord = 8;
extern std::atomic<uintptr_t> g_fd_word[kMaxFd];

inline uintptr_t fd_word(int fd) noexcept {
  return static_cast<unsigned>(fd) < static_cast<unsigned>(kMaxFd)
             ? g_fd_word[fd].load(std::memory_order_acquire)
             : 0;
}

inline Entry entry_of_word(uintptr_t w) noexcept {
  return w >= kConnWord ? Entry::kConn : static_cast<Entry>(w);
}

// A kPending or kInherited connection, shared by its aliases (dup).
struct Pending {
  std::mutex mu;                       // one settle at a time
  std::vector<int> fds;                // every fd number naming it here (table lock)
  pid_t accepted_by = 0;               // the process whose accept() returned it
  uint64_t fork_gen = 0;               // forks made by that process before the accept
  std::atomic<bool> inherited{false};  // came across exec or SCM_RIGHTS, or was sent away
  pid_t unix_peer = 0;                 // kInherited: the socket's creator, to ask
  // Sent over a unix socket: Conn::sent_until_ns for the Conn it becomes.
  std::atomic<int64_t> sent_until_ns{0};
  // A connect()ed one: the offer made before the kernel connect, taken up
  // (or not) by the server when it first uses its end.
  PendingOfferPtr offer;
  // Set (under mu) by close(): a library thread settles it no more.
  bool closing = false;
  // Came across exec or SCM_RIGHTS as the connect()ed end of a connection
  // whose offer its creator still holds (creator.hpp).
  bool connect_side = false;
};

inline Entry entry_of(int fd) noexcept { return entry_of_word(fd_word(fd)); }
// The entry needs find_conn: an upgraded connection, or one to settle first.
inline bool is_conn(int fd) noexcept {
  const uintptr_t w = fd_word(fd);
  return w != 0 && w != static_cast<uintptr_t>(Entry::kListener) &&
         w != static_cast<uintptr_t>(Entry::kRelayed);
}
// find_conn settles the entry first (its first use): pending, inherited or
// foreign (a dormant relay is only woken); meta_conn (meta) all but pending.
inline bool settles_first(int fd, bool meta = false) noexcept {
  const Entry e = entry_of(fd);
  return (e == Entry::kPending && !meta) || e == Entry::kInherited ||
         e == Entry::kForeign;
}
// The connection this process carries for fd, after settling a pending,
// inherited or foreign entry (the fd's first use); null: the fd is a plain
// kernel socket now (kernel TCP, or a relay socket). reads: the use may
// read (or wait to), which starts a dormant relay's delivery; a use that
// only writes leaves it dormant.
std::shared_ptr<Conn> find_conn(int fd, bool reads = true);
// As find_conn, for calls that only look at or set the socket's metadata
// (fcntl, ioctl(FIONBIO), options): a pending connection stays pending, a
// dormant relay dormant.
std::shared_ptr<Conn> meta_conn(int fd);
// The kernel TCP socket behind fd (names and options): fd itself unless fd
// is an upgraded, relayed or foreign connection.
int kernel_socket(int fd);
// The Conn an entry holds, whatever its kind (a foreign one names its owner).
std::shared_ptr<Conn> entry_conn(int fd);
// conn comes from make_conn (conn_guard.hpp).
void install_conn(int fd, std::shared_ptr<Conn> conn);
void install_relayed(int fd, std::shared_ptr<Conn> tcp_only,
                     Entry kind = Entry::kRelayed);
// A dormant relay is read: it and its aliases become kRelayed, and its
// owner starts delivering to it.
void wake_relayed(int fd);
// Every relayed connection, removed from the table (at exit).
std::vector<std::shared_ptr<Conn>> take_relayed_conns();
void install_pending(int fd, std::shared_ptr<Pending> p, Entry kind);
std::shared_ptr<Pending> pending_of(int fd);
// dup: newfd names what oldfd names (any entry but a listener).
void copy_entry(int oldfd, int newfd);
// Removes fd's entry (the caller closes the kernel fd); returns its
// connection, if it had one.
std::shared_ptr<Conn> remove_conn(int fd);
// The connection whose kernel TCP socket or readiness socket is this inode
// (relay.cpp); *readiness tells which.
std::shared_ptr<Conn> conn_by_inode(uint64_t dev, uint64_t ino, bool* readiness);
// Forks this process made so far (a pending connection accepted before the
// last fork may have copies in other processes).
uint64_t fork_generation() noexcept;
// Pending or inherited entries exist (the wait hooks must look at fds).
bool any_pending() noexcept;
// Some connection holds given-back bytes (relay.hpp).
bool any_pushback() noexcept;
void count_pushback(int delta) noexcept;

bool is_listener(int fd) noexcept;
void add_listener(int fd, uint16_t port);
void remove_listener(int fd);
// The port a listener of this process was registered for; 0: not one.
uint16_t listener_port(int fd);

// One line per connection decision ("path=shm" or "path=kernel reason=...").
void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// remote: carried by the cross-host provider (verbs) rather than shm.
void count_path(bool accelerated, bool remote = false) noexcept;
// Upgraded connections this process has made (wait hooks spin only then).
bool any_upgraded() noexcept;

void log_summary();
void reset_counts_in_child();

std::string endpoint(const sockaddr* sa);

// fork: the table lock is held across fork (no child inherits it locked);
// the child leaks its copies of the parent's connections (never closes them).
// Hooks read the table without the lock (fd_word, conn_guard.hpp).
void lock_table_for_fork();
void unlock_table_after_fork();
// The child keeps its copies of the parent's connections as kForeign
// entries and never closes their streams (they are the parent's).
void disown_all_in_child();
// At exit: every connection, removed from the table.
std::vector<std::shared_ptr<Conn>> take_all_conns();

}  // namespace rdmakit::preload
