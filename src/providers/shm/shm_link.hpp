#pragma once
// State shared between a QP (application thread) and the context's progress
// thread: the socket on which the peer's requests arrive, and liveness.
#include <atomic>
#include <cstdint>

#include "providers/shm/shm_unix_socket.hpp"

namespace rdmakit::shm {

struct Link {
  Fd serve_socket;  // peer -> us: requests served by the progress thread
  Fd send_cq_wake;  // dups of the QP's CQ eventfds, so a dead peer
  Fd recv_cq_wake;  // wakes sleepers even mid-teardown
  std::atomic<bool> peer_gone{false};
  uint64_t id = 0;
  // The peer runs as another uid (SO_PEERCRED): the progress thread grants
  // it less (ShmContext::answer).
  bool other_user = false;
};

}  // namespace rdmakit::shm
