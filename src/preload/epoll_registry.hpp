#pragma once
// One epoll set's registrations as epoll_ctl made them, shared by the code
// that keeps them (epoll_set.cpp) and the user-mode epoll_wait that answers
// from them (epoll_wait_user.cpp); see epoll_set.hpp for the design.
#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "process.hpp"
#include "state.hpp"

namespace rdmakit::preload::ep {

// Registrations of upgraded connections with these flags keep the kernel
// path: their semantics live in the kernel's ready list.
constexpr uint32_t kSpecial = EPOLLET | EPOLLONESHOT | EPOLLEXCLUSIVE | EPOLLWAKEUP;

// An upgraded registration as the application sees it (user view: what
// epoll_ctl last asked) and as the kernel holds it. epoll_ctl on a user-mode
// set changes the user view only; the kernel's is brought level before any
// kernel wait on the set (sync_kernel).
struct Upgraded {
  int fd;
  uint32_t events;
  epoll_data_t data;
  std::weak_ptr<Conn> conn;
  // conn's address (its fd-table word): compared and published without
  // locking conn (ConnView, the identity check of user_epoll_ctl).
  uintptr_t word;
  bool in_user;
  bool in_kernel;
  uint32_t k_events;
  uint64_t k_data;
};

struct Reg {
  uint64_t data;
  int up;  // index in EpSet::ups; -1 for a kernel fd
};

// Registrations by fd number, in a flat table: epoll_ctl on the fallback
// path (a program toggling EPOLLOUT per request) allocates nothing.
class RegTable {
 public:
  Reg* find(int fd) noexcept {
    if (fd < 0 || static_cast<size_t>(fd) >= regs_.size()) return nullptr;
    Reg& r = regs_[static_cast<size_t>(fd)];
    return r.up == kAbsent ? nullptr : &r;
  }
  // Throws std::bad_alloc when the table cannot grow.
  void set(int fd, Reg r) {
    const auto i = static_cast<size_t>(fd);
    if (i >= regs_.size())
      regs_.resize(std::max<size_t>({i + 1, 2 * regs_.size(), 64}), kEmpty);
    regs_[i] = r;
  }
  void erase(int fd) noexcept {
    if (Reg* r = find(fd)) *r = kEmpty;
  }
  void clear() noexcept { regs_.clear(); }
  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < regs_.size(); ++i) {
      if (regs_[i].up != kAbsent) f(static_cast<int>(i), regs_[i]);
    }
  }

 private:
  static constexpr int kAbsent = -2;
  static constexpr Reg kEmpty{0, kAbsent};
  std::vector<Reg> regs_;
};

struct DataUse {
  int kernel = 0;
  int upgraded = 0;
};

struct EpSet {
  std::mutex mu;
  int epfd = -1;
  bool tracked = false;  // created by the application in this process image
  // Registrations are kept: made before the first upgrade (none kept then),
  // they are read back from the kernel (import_from_kernel) at the set's
  // first epoll_ctl after it.
  bool imported = false;
  pid_t owner = 0;
  bool nested = false;        // the kernel looks at the set itself
  int special = 0;            // upgraded registrations with kSpecial flags
  int collisions = 0;         // data values of both a kernel and an upgraded registration
  int sleepers = 0;           // threads in a kernel wait on the set
  bool lazy_any = false;      // some connection may have lazy readiness through this set
  bool kernel_stale = false;  // some upgraded registration's kernel view differs
  RegTable regs;
  std::unordered_map<uint64_t, DataUse> data_use;
  std::vector<Upgraded> ups;
  size_t next = 0;                      // where the next scan starts (round robin)
  std::atomic<unsigned> user_calls{0};  // calls answered from user space alone in a row
  // Bumped (s.mu held) by every change of the user view (set_user) and of
  // the upgraded registrations: a spinning user-mode epoll_wait retakes its
  // view when it moved.
  std::atomic<unsigned> changes{0};
  // This set's spin before it sleeps (adaptive_spin); 0: the configured one.
  std::atomic<int64_t> spin_us{0};

  bool user_mode() const noexcept {
    return tracked && !nested && special == 0 && collisions == 0 && !ups.empty() &&
           owner == process_id();
  }
  // Kernel registrations' data matter only beside upgraded ones (a
  // collision): they are counted while ups is not empty (count_kernel_data
  // when the first upgraded one arrives), so the fallback path keeps no map.
  void use_data(uint64_t d, bool upgraded, int delta) {
    if (!upgraded && ups.empty()) return;
    DataUse& u = data_use[d];
    const bool was = u.kernel > 0 && u.upgraded > 0;
    (upgraded ? u.upgraded : u.kernel) += delta;
    const bool now = u.kernel > 0 && u.upgraded > 0;
    collisions += static_cast<int>(now) - static_cast<int>(was);
    if (u.kernel <= 0 && u.upgraded <= 0) data_use.erase(d);
  }
  // Before the first upgraded registration: the kernel ones' data counted.
  void count_kernel_data() {
    regs.for_each([this](int, const Reg& r) {
      if (r.up < 0) ++data_use[r.data].kernel;
    });
  }
};

// The set kept for descriptor fd (created on first use when asked).
EpSet* set_of(int fd, bool create);
// Lazy readiness of c on or off (c.lazy_mu held).
void set_lazy(Conn& c, bool on) noexcept;
// Before the kernel looks at the set: registrations and readiness sockets
// current (s.mu held).
void kernel_current(EpSet& s) noexcept;
// Drops fd's registration from the set (s.mu held).
void remove_reg(EpSet& s, int epfd, int fd);

}  // namespace rdmakit::preload::ep
