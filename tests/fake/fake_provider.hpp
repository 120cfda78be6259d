#pragma once
// An in-process provider for protocol tests, with fault injection (eRPC's
// fake transport is the model). Everything runs in one process: a QP's
// peer is another QP of the same fabric, and each work request executes
// when it is posted (a SEND without a RECV waits, as an RNR retry does).
// What a test can stage at an exact moment:
//   - hold or drop a completion before its CQ sees it (filter), then
//     release the held ones, optionally reordered across QPs (never within
//     one QP, which verbs does not allow);
//   - a peer death (kill, or kill_after N executed send requests): the
//     dead side does nothing more; its peer's QP fails within its
//     peer_timeout (every request and RECV flushed), as on the real
//     providers (tests/conformance PeerDeathTest);
//   - an RNR: the next N messages to a QP find no RECV, posted or not;
//   - a stopped process (freeze): its QP's sends wait and its completions
//     are held (messages to it still land in its posted RECVs, as a NIC
//     answers for a stopped process), until thaw.
// Semantics follow the conformance suite: in-order execution per QP,
// selective signaling (send queue slots retire when a signaled completion
// is polled), errors always complete, later requests flush.
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "rdmakit/rdmakit.hpp"

namespace rdmakit::fake {

enum class Verdict { kDeliver, kDrop, kHold };
// Asked once for each completion, before it reaches its CQ.
using CompletionFilter = std::function<Verdict(const Completion&)>;

// While alive, every Context::open in the process returns a fake context
// (rdmakit/testing.hpp); faults are cleared at both ends of its life.
class Scope {
 public:
  explicit Scope(ProviderKind masquerade = ProviderKind::kShm);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// Fault injection and observation; thread-safe.
void set_filter(CompletionFilter filter);  // nullptr: deliver everything
// Delivers every held completion; reverse_qps delivers the QPs' groups in
// reverse order of first appearance (each QP's own order kept). Returns
// how many were delivered (completions of destroyed CQs are dropped).
size_t release_held(bool reverse_qps = false);
size_t held_count();
void kill(uint32_t qp_num);
// How long after a death its peer's QP fails: 0 (the default) is the QP's
// own peer_timeout (a transport's retries running out); a shorter notice is
// a provider that learns it at once (shm: the peer's socket closes).
void set_death_notice(std::chrono::milliseconds notice);
void kill_after(uint32_t qp_num, uint64_t send_requests);
void refuse_recvs(uint32_t qp_num, uint32_t messages);
void freeze(uint32_t qp_num);
// Delivers what the QP's CQs were held back while frozen, then runs its sends.
void thaw(uint32_t qp_num);
// Send requests executed by a QP so far.
uint64_t executed(uint32_t qp_num);
// Live QPs, in creation order: all, or those Context::connect made, or
// those a Listener::accept made.
enum class Side { kAny, kConnecting, kAccepting };
std::vector<uint32_t> live_qps(Side side = Side::kAny);

}  // namespace rdmakit::fake
