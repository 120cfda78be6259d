#include "process.hpp"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "conn_guard.hpp"
#include "epoll_set.hpp"
#include "fd_place.hpp"
#include "handoff.hpp"
#include "libc.hpp"
#include "relay.hpp"
#include "stat.hpp"
#include "state.hpp"

extern char* program_invocation_short_name;  // glibc

namespace rdmakit::preload {

namespace {

pid_t g_pid = 0;
std::mutex g_engine_mu;
// [0] shm (same host), [1] the cross-host provider (verbs); leaked on fork in the child.
std::shared_ptr<stream::Engine>* g_engine[2] = {nullptr, nullptr};
// shm engines for connections with processes of other users, one per peer
// uid (each admits only that uid, so a peer reaches only the rings of
// connections with its own user); leaked on fork in the child.
constexpr size_t kMaxPeerUsers = 8;
struct UserEngine {
  uid_t uid = 0;
  std::shared_ptr<stream::Engine>* engine = nullptr;
};
UserEngine g_user_engine[kMaxPeerUsers];
bool g_exit_registered = false;
char g_launch_name[64] = "";

void on_prepare() {
  g_engine_mu.lock();
  lock_table_for_fork();
  stats::lock_for_fork();
}
void on_parent() {
  stats::unlock_after_fork();
  unlock_table_after_fork();
  g_engine_mu.unlock();
}
void on_child() {
  g_pid = getpid();
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
  g_engine[0] = g_engine[1] = nullptr;
  for (auto& u : g_user_engine) u = UserEngine{};
  g_engine_mu.unlock();
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
  for (auto* e : g_engine) {
    if (e != nullptr) e->reset();
  }
  for (auto& u : g_user_engine) {
    if (u.engine != nullptr) u.engine->reset();
  }
}

__attribute__((constructor)) void on_load() {
  resolve_libc();
  find_own_code();
  if (program_invocation_short_name != nullptr) {
    std::strncpy(g_launch_name, program_invocation_short_name, sizeof g_launch_name - 1);
  }
  g_pid = getpid();
  pthread_atfork(on_prepare, on_parent, on_child);
  scan_inherited();
}

}  // namespace

pid_t process_id() noexcept { return g_pid; }

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
    opts.max_streams = 1024;
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

}  // namespace

stream::Engine* engine(std::string* why, ProviderKind kind) {
  std::lock_guard lock(g_engine_mu);
  auto*& slot = g_engine[kind == ProviderKind::kShm ? 0 : 1];
  if (slot == nullptr || !*slot) slot = make_engine(kind, std::nullopt, why);
  return slot != nullptr ? slot->get() : nullptr;
}

stream::Engine* engine_for_user(uid_t peer, std::string* why) {
  if (peer == geteuid()) return engine(why);
  std::lock_guard lock(g_engine_mu);
  UserEngine* free_slot = nullptr;
  for (auto& u : g_user_engine) {
    if (u.engine != nullptr && *u.engine && u.uid == peer) return u.engine->get();
    if (u.engine == nullptr && free_slot == nullptr) free_slot = &u;
  }
  if (free_slot == nullptr) {
    *why = "connections with " + std::to_string(kMaxPeerUsers) +
           " other users already: a process keeps one shm engine per peer user";
    return nullptr;
  }
  free_slot->engine = make_engine(ProviderKind::kShm, peer, why);
  if (free_slot->engine == nullptr) return nullptr;
  free_slot->uid = peer;
  return free_slot->engine->get();
}

}  // namespace rdmakit::preload
