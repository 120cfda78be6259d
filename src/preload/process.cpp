#include "process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>

#include "arrival.hpp"
#include "conn_guard.hpp"
#include "early_send.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "libc.hpp"
#include "relay.hpp"
#include "stat.hpp"
#include "state.hpp"
#include "use_watch.hpp"

extern char* program_invocation_short_name;  // glibc

namespace rdmakit::preload {

namespace {

// fork_guard()'s mutex, constructed again in a forked child: glibc tells a
// writer's unlock from a reader's by the thread id, the child's own there.
alignas(std::shared_mutex) unsigned char g_fork_guard[sizeof(std::shared_mutex)];

pid_t g_pid = 0;
std::mutex g_engine_mu;
// The process's stream engines, created on demand; leaked on fork in the
// child. Each holds at most kStreamsPerEngine streams (its completion queue
// is sized for them), so a process with more connections opens another:
// no fixed per-process cap. Kinds: shm for our own user; shm admitting one
// other user (so such a peer reaches only the rings of connections with its
// own user); the cross-host provider (verbs).
constexpr uint32_t kStreamsPerEngine = 1024;
// Rendezvous under way are not streams yet: a new engine is opened this far
// before the others are full.
constexpr uint32_t kEngineHeadroom = 64;
constexpr size_t kMaxEngines = 128;
struct EngineSlot {
  ProviderKind kind = ProviderKind::kAuto;
  std::optional<uid_t> peer;
  std::shared_ptr<stream::Engine>* engine = nullptr;
  // Rendezvous that will start a stream here (a client's offer holds its
  // listener from connect() to its first use).
  std::atomic<uint32_t> reserved{0};
  void clear() noexcept {
    kind = ProviderKind::kAuto;
    peer.reset();
    engine = nullptr;
    reserved.store(0, std::memory_order_relaxed);
  }
};
EngineSlot g_engines[kMaxEngines];
bool g_exit_registered = false;
char g_launch_name[64] = "";

#if defined(__SANITIZE_ADDRESS__)
// GCC 12's AddressSanitizer does not lock its allocator around fork: a
// child forked while another thread allocates inherits the allocator's lock
// taken and hangs at its first malloc. The stream engine's and providers'
// threads are not fork-guarded, so the ASan build waits (at most about
// 20 ms) until every other thread is asleep in the kernel (not 'R' in
// /proc/self/task/TID/stat) before it forks.
void wait_for_idle_threads() {
  const long self = gettid();
  for (int tries = 0; tries < 200; ++tries) {
    bool running = false;
    if (DIR* d = opendir("/proc/self/task")) {
      while (const dirent* e = readdir(d)) {
        const long tid = std::strtol(e->d_name, nullptr, 10);
        if (tid <= 0 || tid == self) continue;
        char path[64];
        std::snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
        char buf[256] = {};
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        const ssize_t n = real().read(fd, buf, sizeof buf - 1);
        real().close(fd);
        // "tid (comm) S ...": the state follows the last ')'.
        const char* paren = n > 0 ? std::strrchr(buf, ')') : nullptr;
        if (paren != nullptr && paren[1] == ' ' && paren[2] == 'R') running = true;
      }
      closedir(d);
    }
    if (!running) return;
    usleep(100);
  }
}
#else
void wait_for_idle_threads() {}
#endif

void on_prepare() {
  // First: the library's threads take the others while they work.
  fork_guard().lock();
  wait_for_idle_threads();
  g_engine_mu.lock();
  lock_table_for_fork();
  stats::lock_for_fork();
  early_lock_for_fork();
}
void on_parent() {
  early_unlock_after_fork();
  stats::unlock_after_fork();
  unlock_table_after_fork();
  g_engine_mu.unlock();
  fork_guard().unlock();
  watch_offers_after_fork();
}
void on_child() {
  forget_all_library_fds();
  g_pid = getpid();
  forget_answerer_in_child();
  forget_relay_server_in_child();
  reset_counts_in_child();
  disown_all_in_child();
  hazards_after_fork_in_child();
  forget_epoll_sets_in_child();
  stats::drop_in_child();
  stats::unlock_after_fork();
  unlock_table_after_fork();
  // The parent's engine has no progress thread here; the child makes its
  // own if it upgrades a connection of its own.
  for (auto& e : g_engines) e.clear();
  g_engine_mu.unlock();
  new (g_fork_guard) std::shared_mutex();  // the parent's threads are not here
  relay_foreign_in_child();
}

// Queued data still reaches the peer when the program exits: close every
// stream, then let the engine wait (up to the streams' linger) for them.
void on_exit() {
  if (getpid() != g_pid) return;
  log_summary();
  for (auto& c : take_relayed_conns()) {
    if (c) give_back(*c);  // once per connection: later aliases find it done
  }
  stop_relay_server();
  auto conns = take_all_conns();
  conns.clear();
  std::lock_guard lock(g_engine_mu);
  for (auto& e : g_engines) {
    if (e.engine != nullptr) e.engine->reset();
  }
}

__attribute__((constructor)) void on_load() {
  resolve_libc();
  find_own_code();
  reserve_fd_room();
  if (program_invocation_short_name != nullptr) {
    std::strncpy(g_launch_name, program_invocation_short_name, sizeof g_launch_name - 1);
  }
  g_pid = getpid();
  pthread_atfork(on_prepare, on_parent, on_child);
  scan_inherited();
  watch_inherited_use();
}

}  // namespace

pid_t process_id() noexcept { return g_pid; }

std::shared_mutex& fork_guard() noexcept {
  static std::shared_mutex* const guard = new (g_fork_guard) std::shared_mutex();
  return *guard;
}

const char* program_name() noexcept { return program_invocation_short_name; }

const char* launch_name() noexcept { return g_launch_name; }

namespace {

// Caller holds g_engine_mu. `peer` set: an shm engine that admits that uid.
std::shared_ptr<stream::Engine>* make_engine(ProviderKind kind, std::optional<uid_t> peer,
                                             std::string* why) {
  try {
    stream::EngineOptions opts;
    opts.provider = kind;
    opts.on_thread_start = mark_engine_thread;
    opts.max_streams = kStreamsPerEngine;
    if (peer) opts.shm.allowed_uids = {*peer};
    // Bulk senders (iperf3) write 128 KiB at a time: rings of that order
    // keep a write from waiting for every credit return.
    const uint32_t ring =
        kind == ProviderKind::kShm ? config().shm_ring_bytes : config().remote_ring_bytes;
    opts.stream.rx_ring = ring;
    opts.stream.tx_buffer = ring;
    auto e = stream::Engine::create(opts);
    if (!g_exit_registered) {
      std::atexit(on_exit);
      g_exit_registered = true;
    }
    return new std::shared_ptr<stream::Engine>(std::move(e));  // NOLINT: lives to exit
  } catch (const std::exception& e) {
    *why = std::string("stream engine on ") + provider_name(kind) + ": " + e.what();
    return nullptr;
  }
}

// A live engine of this kind with room, else a new one.
stream::Engine* find_engine(ProviderKind kind, std::optional<uid_t> peer,
                            std::string* why) {
  std::lock_guard lock(g_engine_mu);
  EngineSlot* free_slot = nullptr;
  size_t same = 0;
  for (auto& e : g_engines) {
    if (e.engine == nullptr || !*e.engine) {
      if (free_slot == nullptr) free_slot = &e;
      continue;
    }
    if (e.kind != kind || e.peer != peer) continue;
    ++same;
    if ((*e.engine)->stream_count() + e.reserved.load(std::memory_order_relaxed) +
            kEngineHeadroom <
        kStreamsPerEngine)
      return e.engine->get();
  }
  if (free_slot == nullptr) {
    *why = "the process holds " + std::to_string(kMaxEngines) + " stream engines already";
    return nullptr;
  }
  free_slot->engine = make_engine(kind, peer, why);
  if (free_slot->engine == nullptr) return nullptr;
  free_slot->kind = kind;
  free_slot->peer = peer;
  if (same > 0) {
    log_line("engine %zu on %s opened: the others hold %u streams each", same + 1,
             provider_name(kind), kStreamsPerEngine - kEngineHeadroom);
  }
  return free_slot->engine->get();
}

}  // namespace

stream::Engine* engine(std::string* why, ProviderKind kind) {
  return find_engine(kind, std::nullopt, why);
}

stream::Engine* engine_for_user(uid_t peer, std::string* why) {
  if (peer == geteuid()) return engine(why);
  return find_engine(ProviderKind::kShm, peer, why);
}

void reserve_stream(stream::Engine* e, int delta) noexcept {
  std::lock_guard lock(g_engine_mu);
  for (auto& slot : g_engines) {
    if (slot.engine != nullptr && slot.engine->get() == e) {
      slot.reserved.fetch_add(static_cast<uint32_t>(delta), std::memory_order_relaxed);
      return;
    }
  }
}

}  // namespace rdmakit::preload
