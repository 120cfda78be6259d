#include "conn_guard.hpp"

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
    if (&r != t_hazards) r.claimed.store(false, std::memory_order_relaxed);
  }
}

}  // namespace rdmakit::preload
