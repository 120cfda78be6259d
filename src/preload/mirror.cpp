#include "mirror.hpp"

#include <arpa/inet.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "handoff.hpp"
#include "process.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rendezvous.hpp"
#include "rendezvous_wire.hpp"

namespace rdmakit::preload {

namespace {

thread_local bool t_mirror_helper = false;

// Per port of a listener of this process: the threads inside accept() on
// it now, and the last thread that called accept() on it.
std::atomic<uint16_t> g_accepting[65536];
std::atomic<pid_t> g_last_acceptor[65536];

// How long a client end waits for another thread of this process to accept
// it: an accept() already blocked in another thread returns within
// microseconds of the kernel connect.
constexpr auto kAcceptWait = std::chrono::microseconds(1000);
constexpr auto kAcceptPoll = std::chrono::microseconds(50);

enum class Claim { kOurs, kBusy, kNotOurs };

// p may be settled in its stead when this process made it: the other side
// of a `client` end is an end it accepted (not inherited, not from before a
// fork), the other side of an accepted end a client end whose listener is
// this process. Looked at only when nobody is settling it (kBusy).
Claim claim(const std::shared_ptr<Pending>& p, bool client) {
  std::unique_lock lock(p->mu, std::try_to_lock);
  if (!lock.owns_lock()) return Claim::kBusy;
  const bool ours = client ? !p->offer && !p->inherited.load() &&
                                 p->accepted_by == process_id() &&
                                 p->fork_gen == fork_generation()
                           : p->offer && offer_listener_here(*p->offer) &&
                                 p->fork_gen == fork_generation();
  return ours ? Claim::kOurs : Claim::kNotOurs;
}

}  // namespace

bool settling_for_mirror() noexcept { return t_mirror_helper; }

Mirror find_mirror(int fd, bool client) {
  if (t_mirror_helper) return {};
  // An accepted end can only mirror a client end of this process whose
  // listener is this process, which holds such an offer until it is settled.
  if (!client && !offers_to_this_process()) return {};
  wire::Tuple mine;
  std::string where;
  if (!wire::socket_tuple(fd, client, &mine, &where).empty()) return {};
  const auto self = pending_of(fd);
  for (int a = 0; a < kMaxFd; ++a) {
    if (a == fd || entry_of(a) != Entry::kPending) continue;
    auto p = pending_of(a);
    if (!p || p == self) continue;
    // The other end names the same connection from the other side.
    wire::Tuple theirs;
    if (!wire::socket_tuple(a, !client, &theirs, &where).empty()) continue;
    if (std::memcmp(&theirs, &mine, sizeof mine) != 0) continue;
    switch (claim(p, client)) {
      case Claim::kOurs: return {a, std::move(p)};
      case Claim::kBusy: return {a, nullptr};
      case Claim::kNotOurs: return {};
    }
  }
  return {};
}

Mirror await_accepted_mirror(int fd) {
  wire::Tuple t;
  std::string where;
  if (!wire::socket_tuple(fd, true, &t, &where).empty()) return {};
  const uint16_t port = ntohs(t.server_port);
  const auto start = wire::Clock::now();
  const pid_t self = gettid();
  for (;;) {
    if (Mirror m = find_mirror(fd, true)) return m;
    const auto now = wire::Clock::now();
    // Another thread accepts on this port (inside accept() now, or the one
    // that called it last): wait for it as for another process. Otherwise
    // this thread may be the one that accepts: a millisecond only.
    const pid_t last = g_last_acceptor[port].load(std::memory_order_relaxed);
    const bool other_acceptor = g_accepting[port].load(std::memory_order_relaxed) > 0 ||
                                (last != 0 && last != self);
    if (now >= start + (other_acceptor ? config().timeout : kAcceptWait)) return {};
    std::this_thread::sleep_for(kAcceptPoll);
  }
}

AcceptWatch::AcceptWatch(int listen_fd) noexcept : port_(listener_port(listen_fd)) {
  if (port_ == 0) return;
  g_last_acceptor[port_].store(gettid(), std::memory_order_relaxed);
  g_accepting[port_].fetch_add(1, std::memory_order_relaxed);
}

AcceptWatch::~AcceptWatch() {
  if (port_ != 0) g_accepting[port_].fetch_sub(1, std::memory_order_relaxed);
}

MirrorSettle::MirrorSettle(Mirror other) noexcept {
  try {
    thread_ = rdmakit::detail::start_library_thread([other = std::move(other)] {
      t_mirror_helper = true;
      settle_if_pending(other.fd, other.pending);
    });
  } catch (...) {
    // No thread: the caller settles its end alone (the budget then bounds
    // the wait, as before this helper existed).
  }
}

MirrorSettle::~MirrorSettle() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace rdmakit::preload
