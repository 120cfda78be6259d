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
  // Lazy readiness (epoll_set.hpp): lazy and epoll_set under lazy_mu.
  std::mutex lazy_mu;
  std::atomic<bool> lazy{false};   // Stream::set_lazy_readiness(true) is in force
  int epoll_set = -1;              // the one epoll set it is registered in; -1 none
  std::atomic<bool> eager{false};  // watched by the kernel elsewhere: never lazy
  // Its slot in the published statistics (stat.hpp); nullptr: not listed.
  stats::Slot* stat_slot = nullptr;
  ~Conn();
};

constexpr int kMaxFd = 1 << 16;

// Lock-free test used by every hook before anything else.
bool is_conn(int fd) noexcept;
std::shared_ptr<Conn> find_conn(int fd);
void install_conn(int fd, std::shared_ptr<Conn> conn);
// Removes fd's entry (the caller closes the kernel fd); returns it.
std::shared_ptr<Conn> remove_conn(int fd);

bool is_listener(int fd) noexcept;
void add_listener(int fd, uint16_t port);
void remove_listener(int fd);

// One line per connection decision ("path=shm" or "path=kernel reason=...").
void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// remote: carried by the cross-host provider (verbs) rather than shm.
void count_path(bool accelerated, bool remote = false) noexcept;
// A forked child touched its parent's upgraded connection: EOPNOTSUPP,
// logged once per connection (never a silent failure).
bool refuse_foreign(Conn& c, int fd, const char* call);
// Upgraded connections this process has made (wait hooks spin only then).
bool any_upgraded() noexcept;

void log_summary();
void reset_counts_in_child();

std::string endpoint(const sockaddr* sa);

// fork: the table lock is held across fork (no child inherits it locked);
// the child leaks its copies of the parent's connections (never closes them).
void lock_table_for_fork();
void unlock_table_after_fork();
void disown_all_in_child();
// At exit: every connection, removed from the table.
std::vector<std::shared_ptr<Conn>> take_all_conns();

}  // namespace rdmakit::preload
