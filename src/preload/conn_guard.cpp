#include "conn_guard.hpp"

#include <algorithm>
#include <new>

#include "rdmakit/detail/spin.hpp"
#include "state.hpp"

namespace rdmakit::preload {

__thread HazardRecord* t_hazards __attribute__((tls_model("initial-exec"))) = nullptr;
__thread unsigned t_hazard_depth __attribute__((tls_model("initial-exec"))) = 0;

namespace {

// Threads with a record at once; a thread past them takes the table lock
// in every hook (find_conn).
constexpr int kMaxRecords = 4096;
HazardRecord g_records[kMaxRecords];
std::atomic<int> g_records_used{0};  // high-water mark: a free scans below it

// No record for this thread: all were taken, or it is exiting.
__thread bool t_no_record __attribute__((tls_model("initial-exec"))) = false;
// This thread has a ConnView open (a nested one is refused), and holds its
// record's view_mu: a free on this thread (a signal handler's close) must
// not wait for that lock, and reads the view directly.
__thread bool t_view_open __attribute__((tls_model("initial-exec"))) = false;
__thread bool t_view_busy __attribute__((tls_model("initial-exec"))) = false;

void lock_view(HazardRecord& r) noexcept {
  detail::SpinBackoff backoff;
  while (r.view_mu.exchange(true, std::memory_order_acquire)) {
    while (r.view_mu.load(std::memory_order_relaxed)) backoff.pause();
  }
}

void unlock_view(HazardRecord& r) noexcept {
  r.view_mu.store(false, std::memory_order_release);
}

// r's view holds the Conn of word w: its free is handed to r's owner, which
// does it at ConnView::close. r.view_mu held (or r is this thread's own
// record, interrupted inside its section).
bool hand_to_view(HazardRecord& r, uintptr_t w) noexcept {
  const uint32_t n = r.view_len.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < n; ++i) {
    if (r.view[i].load(std::memory_order_relaxed) == w) {
      r.view[i].store(w | kHandedOver, std::memory_order_relaxed);
      r.view_handed.store(true, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

// Gives the thread's record back when it exits.
struct RecordOwner {
  HazardRecord* rec = nullptr;
  RecordOwner() = default;
  RecordOwner(const RecordOwner&) = delete;
  RecordOwner& operator=(const RecordOwner&) = delete;
  ~RecordOwner() {
    t_no_record = true;  // a hook in a later thread-exit destructor takes the lock
    t_hazards = nullptr;
    if (rec != nullptr) rec->claimed.store(false, std::memory_order_release);
  }
};
thread_local RecordOwner t_owner;

// Frees c unless a thread's record holds it; then that thread's slot gets
// the free (kHandedOver), and it frees c, or hands it on, as its call
// returns. c is in no table slot any more (its last owner let go).
void free_unless_held(Conn* c) noexcept {
  const auto w = reinterpret_cast<uintptr_t>(c);
  // Every access here, the slot's change that dropped c (state.cpp
  // set_kind) and a hook's publish-then-check (ConnGuard) is seq_cst: a
  // hook that saw c still in its slot published it before that change, so
  // the reads below see it.
  const int n = g_records_used.load(std::memory_order_seq_cst);
  for (int i = 0; i < n; ++i) {
    for (auto& h : g_records[i].hz) {
      uintptr_t held = w;
      if (h.load(std::memory_order_seq_cst) == w &&
          h.compare_exchange_strong(held, w | kHandedOver, std::memory_order_acq_rel)) {
        return;
      }
    }
  }
  // Views: under each record's lock, which orders this scan against the
  // owner's publication (ConnView::open) and its liveness check after it.
  for (int i = 0; i < n; ++i) {
    HazardRecord& r = g_records[i];
    if (&r == t_hazards && t_view_busy) {
      if (hand_to_view(r, w)) return;
      continue;
    }
    lock_view(r);
    const bool held = hand_to_view(r, w);
    unlock_view(r);
    if (held) return;
  }
  delete c;  // NOLINT(cppcoreguidelines-owning-memory): make_conn's allocation
}

}  // namespace

std::shared_ptr<Conn> make_conn() {
  return {new Conn(), free_unless_held};  // NOLINT(cppcoreguidelines-owning-memory)
}

HazardRecord* claim_hazards() noexcept {
  if (t_no_record) return nullptr;
  for (int i = 0; i < kMaxRecords; ++i) {
    HazardRecord& r = g_records[i];
    bool taken = false;
    if (r.claimed.load(std::memory_order_relaxed) ||
        !r.claimed.compare_exchange_strong(taken, true, std::memory_order_acq_rel)) {
      continue;
    }
    int used = g_records_used.load(std::memory_order_seq_cst);
    while (used < i + 1 && !g_records_used.compare_exchange_weak(
                               used, i + 1, std::memory_order_seq_cst)) {
    }
    t_owner.rec = &r;  // registers the release at thread exit
    t_hazards = &r;
    return &r;
  }
  t_no_record = true;
  return nullptr;
}

void take_handed(uintptr_t word) noexcept {
  free_unless_held(reinterpret_cast<Conn*>(word & ~kHandedOver));  // NOLINT
}

void hazards_after_fork_in_child() noexcept {
  const int n = g_records_used.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    HazardRecord& r = g_records[i];
    for (auto& h : r.hz) h.store(0, std::memory_order_relaxed);
    // A lock another parent thread held at the fork is nobody's here.
    r.view_mu.store(false, std::memory_order_relaxed);
    if (&r != t_hazards) {
      r.claimed.store(false, std::memory_order_relaxed);
      r.view_len.store(0, std::memory_order_relaxed);
      r.view_handed.store(false, std::memory_order_relaxed);
    }
  }
}

bool ConnView::open(const uintptr_t* words, size_t n) noexcept {
  if (rec_ != nullptr || t_view_open || n > UINT32_MAX) return false;
  HazardRecord* rec = t_hazards;
  if (rec == nullptr) [[unlikely]] {
    rec = claim_hazards();
    if (rec == nullptr) return false;
  }
  // Grown outside the lock, only past the largest view so far.
  std::atomic<uintptr_t>* fresh = nullptr;
  uint32_t cap = rec->view_cap;
  if (n > cap) [[unlikely]] {
    cap = static_cast<uint32_t>(std::max<size_t>({n, 2 * static_cast<size_t>(cap), 16}));
    fresh =
        new (std::nothrow) std::atomic<uintptr_t>[cap];  // NOLINT: owned by the record
    if (fresh == nullptr) return false;
  }
  t_view_open = true;
  t_view_busy = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  lock_view(*rec);
  std::atomic<uintptr_t>* old = nullptr;
  if (fresh != nullptr) {
    old = rec->view;
    rec->view = fresh;
    rec->view_cap = cap;
  }
  for (size_t i = 0; i < n; ++i) rec->view[i].store(words[i], std::memory_order_relaxed);
  rec->view_len.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  unlock_view(*rec);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_view_busy = false;
  delete[] old;  // NOLINT: no other thread reads it once the lock is let go
  rec_ = rec;
  return true;
}

void ConnView::close() noexcept {
  HazardRecord* rec = rec_;
  if (rec == nullptr) return;
  rec_ = nullptr;
  t_view_busy = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  lock_view(*rec);
  const uint32_t n = rec->view_len.load(std::memory_order_relaxed);
  rec->view_len.store(0, std::memory_order_relaxed);
  // A free on this thread from here on finds no view; one before it set
  // view_handed already.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const bool handed = rec->view_handed.load(std::memory_order_relaxed);
  rec->view_handed.store(false, std::memory_order_relaxed);
  unlock_view(*rec);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_view_busy = false;
  // Nobody else writes the entries now (the view is empty); t_view_open
  // keeps a nested view from reusing them until this loop is done.
  if (handed) {
    for (uint32_t i = 0; i < n; ++i) {
      const uintptr_t w = rec->view[i].load(std::memory_order_relaxed);
      if ((w & kHandedOver) == 0) continue;
      rec->view[i].store(0, std::memory_order_relaxed);
      take_handed(w);
    }
  }
  t_view_open = false;
}

}  // namespace rdmakit::preload
