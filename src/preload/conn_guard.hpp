#pragma once
// Lifetime of a connection a hook finds in the fd table without its lock
// (docs/preload.md, "Interception"). The slot of an upgraded fd holds a
// raw Conn*; a hook protects it with a hazard pointer: it publishes the
// pointer in its thread's record, checks that the slot still holds it, and
// clears the record when the call returns. The Conn's last owner (the
// shared_ptr deleter of make_conn) frees it only when no record holds it;
// otherwise it hands the free to a thread whose record does, which frees it
// (or hands it on) as its call returns. A close() racing a read() on
// another thread thus leaves the stream to that read until it returns, as
// the kernel keeps a file open under a call in progress. Two locked
// instructions per call, each on the calling thread's own cache line; no
// lock, no shared count.
#include <atomic>
#include <cstdint>
#include <memory>

namespace rdmakit::preload {

struct Conn;

// A new connection, shared by the table's slots and the control path; its
// last release frees it through the hazard check. Every Conn comes from here.
std::shared_ptr<Conn> make_conn();

// Hooks in progress on one thread at once (a hook inside a signal handler
// that interrupted another, splice's two ends); deeper ones take the lock.
constexpr unsigned kHazardDepth = 4;

struct alignas(64) HazardRecord {
  std::atomic<uintptr_t> hz[kHazardDepth];
  std::atomic<bool> claimed;
  // A wait's view (ConnView): many Conns at once, in an array the record
  // keeps across calls. view_mu is a spin lock between the owner (two short
  // sections per wait) and a thread freeing a Conn (free_unless_held).
  std::atomic<bool> view_mu;
  std::atomic<uint32_t> view_len;  // entries in force; 0: no view
  std::atomic<bool> view_handed;   // some entry carries kHandedOver
  std::atomic<uintptr_t>* view;    // view_cap entries (owner-grown)
  uint32_t view_cap;
};

// This thread's record (nullptr until its first guarded call), and how
// many of its slots are in use. Initial-exec: a preloaded library's TLS is
// static, so a hook reads them without a call.
extern __thread HazardRecord* t_hazards __attribute__((tls_model("initial-exec")));
extern __thread unsigned t_hazard_depth __attribute__((tls_model("initial-exec")));

// This thread's record, claimed at its first guarded call; nullptr when
// every record is taken or the thread is exiting (the hook takes the lock).
HazardRecord* claim_hazards() noexcept;
// The free of a Conn handed to this thread's slot (the hazard word with
// its low bit set): frees it now, or hands it on.
void take_handed(uintptr_t word) noexcept;
// A forked child has one thread: the other records are free, and no Conn
// of the parent's is ever freed here (state.hpp disown_all_in_child).
void hazards_after_fork_in_child() noexcept;

constexpr uintptr_t kHandedOver = 1;

// A wait's view of many connections (a user-mode epoll_wait's registrations,
// epoll_wait_user.cpp), protected as ConnGuard protects one, without a
// locked instruction per connection: open() publishes the Conns' words in
// the thread's record; a Conn whose owner reference the caller then still
// finds alive (a weak_ptr not expired) stays allocated until close(), which
// frees those whose last owner let go meanwhile (or hands them on). A
// close() on another thread during the wait thus ends the stream when the
// wait returns, as a per-call shared_ptr snapshot did. One view per thread;
// a nested one (a signal handler's wait) is refused.
class ConnView {
 public:
  ConnView() = default;
  ConnView(const ConnView&) = delete;
  ConnView& operator=(const ConnView&) = delete;
  ~ConnView() { close(); }
  // Publishes words[0..n); false (nothing published) without a record, in
  // a nested view, or when the array cannot grow: the caller takes its
  // locked path. Grows the array only past its largest use so far.
  bool open(const uintptr_t* words, size_t n) noexcept;
  void close() noexcept;

 private:
  HazardRecord* rec_ = nullptr;
};

// Protects the Conn a table slot named when the hook read it (word w),
// if the slot still names it; empty otherwise (the slot changed, or no
// hazard slot was free): the hook then takes the locked path.
class ConnGuard {
 public:
  ConnGuard(const std::atomic<uintptr_t>& slot, uintptr_t w) noexcept {
    HazardRecord* rec = t_hazards;
    if (rec == nullptr) [[unlikely]] {
      rec = claim_hazards();
      if (rec == nullptr) return;
    }
    const unsigned d = t_hazard_depth;
    if (d >= kHazardDepth) [[unlikely]]
      return;
    // A hook in a signal handler arriving from here on takes the next slot.
    t_hazard_depth = d + 1;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    hz_ = &rec->hz[d];
    hz_->store(w, std::memory_order_seq_cst);
    if (slot.load(std::memory_order_seq_cst) == w) [[likely]] {
      conn_ = reinterpret_cast<Conn*>(w);  // NOLINT(performance-no-int-to-ptr)
    } else {
      release();
    }
  }
  ~ConnGuard() {
    if (hz_ != nullptr) release();
  }
  ConnGuard(const ConnGuard&) = delete;
  ConnGuard& operator=(const ConnGuard&) = delete;

  explicit operator bool() const noexcept { return conn_ != nullptr; }
  Conn& operator*() const noexcept { return *conn_; }

 private:
  void release() noexcept {
    const uintptr_t v = hz_->exchange(0, std::memory_order_acq_rel);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --t_hazard_depth;
    hz_ = nullptr;
    if ((v & kHandedOver) != 0) [[unlikely]]
      take_handed(v);
  }

  std::atomic<uintptr_t>* hz_ = nullptr;
  Conn* conn_ = nullptr;
};

}  // namespace rdmakit::preload
