#pragma once
// The statistics file this process publishes for rdmakit-stat (docs/stat.md):
// one slot per connection the preload decided about, counters updated by the
// I/O hooks without a syscall. Created at the first decision, removed at
// exit. RDMAKIT_PRELOAD_STAT=0 turns it off; RDMAKIT_PRELOAD_STAT_DIR moves
// it (default /dev/shm).
#include <sys/types.h>

#include <string>

#include "stat_format.hpp"

namespace rdmakit::preload::stats {

struct Decision {
  int fd = -1;
  Side side = kSideNone;
  Path path = kPathNone;
  std::string local;
  std::string peer;
  const char* reason = "";  // kPathKernel: why
  uint32_t ring_bytes = 0;
};

// A slot for an upgraded connection (counted), or nullptr (publishing off,
// no file, or every slot in use: counted in the header as unlisted).
Slot* claim_upgraded(const Decision& d);
// A kernel-TCP connection: listed (no byte counts) until its fd is closed;
// the reason is counted per process.
void note_fallback(const Decision& d);
// The connection is gone: its counters go to the process totals and the
// slot is shown as closed until it is reused.
void release(Slot* s) noexcept;
// fd was closed, or its number reused: ends its kernel-TCP slot if any.
void forget_fd(int fd) noexcept;
// fork: held across it; in the child, the parent's file and slots are not
// this process's (called with the lock held, before unlock_after_fork).
void lock_for_fork() noexcept;
void unlock_after_fork() noexcept;
void drop_in_child() noexcept;

inline void count_tx(Slot* s, size_t n) noexcept {
  if (s == nullptr) return;
  bump(s->tx_bytes, n);
  bump(s->tx_msgs, 1);
}

inline void count_rx(Slot* s, size_t n) noexcept {
  if (s == nullptr) return;
  bump(s->rx_bytes, n);
  bump(s->rx_msgs, 1);
  if (n > s->rx_peak.load(std::memory_order_relaxed)) {
    s->rx_peak.store(n, std::memory_order_relaxed);
  }
}

}  // namespace rdmakit::preload::stats
