#pragma once
// State shared between a QP (application thread) and the context's progress
// thread: the socket on which the peer's requests arrive, and liveness.
#include <atomic>
#include <cstdint>
#include <memory>

#include "providers/shm/shm_unix_socket.hpp"

namespace rdmakit::shm {

struct Link {
  Fd serve_socket;  // peer -> us: requests served by the progress thread
  // The QP's CQ eventfds (shared with the CQs, not one dup per QP), so a
  // dead peer wakes sleepers even mid-teardown.
  std::shared_ptr<const Fd> send_cq_wake;
  std::shared_ptr<const Fd> recv_cq_wake;
  std::atomic<bool> peer_gone{false};
  uint64_t id = 0;
  // The peer runs as another uid (SO_PEERCRED): the progress thread grants
  // it less (ShmContext::answer).
  bool other_user = false;
};

}  // namespace rdmakit::shm
