#include "mirror.hpp"

#include <cstring>
#include <string>

#include "handoff.hpp"
#include "rendezvous.hpp"
#include "rendezvous_wire.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

thread_local bool t_mirror_helper = false;

// How long a client end waits for another thread of this process to accept
// it: an accept() already blocked in another thread returns within
// microseconds of the kernel connect.
constexpr auto kAcceptWait = std::chrono::microseconds(1000);
constexpr auto kAcceptPoll = std::chrono::microseconds(50);

}  // namespace

bool settling_for_mirror() noexcept { return t_mirror_helper; }

int find_mirror(int fd, bool client) {
  if (t_mirror_helper) return -1;
  // A server end can only mirror a client end of this process, which holds
  // an offer until it is settled.
  if (!client && !offers_outstanding()) return -1;
  wire::Tuple mine;
  std::string where;
  if (!wire::socket_tuple(fd, client, &mine, &where).empty()) return -1;
  const auto self = pending_of(fd);
  for (int a = 0; a < kMaxFd; ++a) {
    if (a == fd || entry_of(a) != Entry::kPending) continue;
    const auto p = pending_of(a);
    if (!p || p == self) continue;
    // The other end names the same connection from the other side.
    wire::Tuple theirs;
    if (!wire::socket_tuple(a, !client, &theirs, &where).empty()) continue;
    if (std::memcmp(&theirs, &mine, sizeof mine) == 0) return a;
  }
  return -1;
}

int await_accepted_mirror(int fd) {
  const auto until = wire::Clock::now() + kAcceptWait;
  for (;;) {
    if (const int m = find_mirror(fd, true); m >= 0) return m;
    if (wire::Clock::now() >= until) return -1;
    std::this_thread::sleep_for(kAcceptPoll);
  }
}

MirrorSettle::MirrorSettle(int fd)
    : thread_([fd] {
        t_mirror_helper = true;
        settle(fd);
      }) {}

MirrorSettle::~MirrorSettle() { thread_.join(); }

}  // namespace rdmakit::preload
