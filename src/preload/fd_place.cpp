#include "fd_place.hpp"

#include <fcntl.h>
#include <link.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "libc.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

struct Range {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};
constexpr int kMaxRanges = 8;
Range g_ranges[kMaxRanges];
int g_nranges = 0;
// Library descriptors go to [g_far, limit), else [g_base, limit). g_far is
// past the fd table (state.hpp) when the real limit leaves room there, so
// that the kernel TCP sockets of upgraded connections, which must stay in
// the table, keep [g_base, kMaxFd) to themselves.
std::atomic<int> g_base{0};
std::atomic<int> g_far{0};
// The first number the application's soft limit forbids (INT_MAX: none).
std::atomic<int> g_app_end{INT_MAX};

int collect(dl_phdr_info* info, size_t /*size*/, void* /*data*/) {
  const char* name = info->dlpi_name;
  if (name == nullptr) return 0;
  const char* slash = std::strrchr(name, '/');
  const char* base = slash != nullptr ? slash + 1 : name;
  if (std::strncmp(base, "librdmakit", 10) != 0) return 0;
  for (int i = 0; i < info->dlpi_phnum && g_nranges < kMaxRanges; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    g_ranges[g_nranges++] = {lo, lo + ph.p_memsz};
  }
  return 0;
}

}  // namespace

void find_own_code() noexcept {
  g_nranges = 0;
  dl_iterate_phdr(collect, nullptr);
}

namespace {
// Initial-exec, as conn_guard.hpp's: a preloaded library's TLS is static,
// and the wait hooks ask engine_thread() on every call (the default model
// costs a __tls_get_addr call per read).
__thread int t_internal __attribute__((tls_model("initial-exec"))) = 0;
__thread bool t_engine __attribute__((tls_model("initial-exec"))) = false;
}  // namespace

void mark_engine_thread() noexcept { t_engine = true; }
bool engine_thread() noexcept { return t_engine; }

InternalScope::InternalScope() noexcept { ++t_internal; }
InternalScope::~InternalScope() { --t_internal; }

bool internal_caller(const void* ret) noexcept {
  if (t_internal > 0 || t_engine) return true;
  const auto a = reinterpret_cast<uintptr_t>(ret);  // NOLINT
  for (int i = 0; i < g_nranges; ++i) {
    if (a >= g_ranges[i].lo && a < g_ranges[i].hi) return true;
  }
  return false;
}

int high_base() noexcept { return g_base.load(std::memory_order_relaxed); }

namespace {

// One bit per descriptor number the library owns. Past the bitmap (a real
// limit above a million) descriptors are not told apart: they are closed
// when asked, as before.
constexpr unsigned kOwnBits = 1u << 20;
std::atomic<uint64_t> g_own[kOwnBits / 64];

void own(int fd) noexcept {
  if (fd >= 0 && static_cast<unsigned>(fd) < kOwnBits) {
    g_own[static_cast<unsigned>(fd) / 64].fetch_or(uint64_t{1} << (fd % 64),
                                                   std::memory_order_relaxed);
  }
}

}  // namespace

bool library_fd(int fd) noexcept {
  return fd >= 0 && static_cast<unsigned>(fd) < kOwnBits &&
         (g_own[static_cast<unsigned>(fd) / 64].load(std::memory_order_relaxed) &
          (uint64_t{1} << (fd % 64))) != 0;
}

void own_library_fd(int fd) noexcept {
  if (g_base.load(std::memory_order_relaxed) != 0) own(fd);
}

void forget_all_library_fds() noexcept {
  for (auto& word : g_own) word.store(0, std::memory_order_relaxed);
}

void forget_library_fd(int fd) noexcept {
  if (library_fd(fd)) {
    g_own[static_cast<unsigned>(fd) / 64].fetch_and(~(uint64_t{1} << (fd % 64)),
                                                    std::memory_order_relaxed);
  }
}

int for_each_app_range(unsigned first, unsigned last,
                       int (*close_gap)(unsigned lo, unsigned hi, int flags), int flags) {
  unsigned lo = first;
  const unsigned end = last < kOwnBits - 1 ? last : kOwnBits - 1;
  for (unsigned fd = first; fd <= end && fd >= first; ++fd) {
    const uint64_t word = g_own[fd / 64].load(std::memory_order_relaxed);
    if (word == 0 && fd % 64 == 0 && fd + 63 <= end) {
      fd += 63;  // a word of numbers the library does not hold
      continue;
    }
    if ((word & (uint64_t{1} << (fd % 64))) == 0) continue;
    if (fd > lo) {
      if (const int r = close_gap(lo, fd - 1, flags); r != 0) return r;
    }
    lo = fd + 1;
  }
  if (lo <= last && lo >= first) return close_gap(lo, last, flags);
  return 0;
}

int place_high(int fd) noexcept {
  const int base = g_base.load(std::memory_order_relaxed);
  if (fd < 0 || base == 0) return fd;
  if (fd >= base) {
    // Library descriptors never reach an exec'd image, whatever flags the
    // call that made this one took (the low branch's F_DUPFD_CLOEXEC says
    // the same).
    (void)real().fcntl(fd, F_SETFD, FD_CLOEXEC);
    own(fd);
    return fd;
  }
  const int far = g_far.load(std::memory_order_relaxed);
  int moved = real().fcntl(fd, F_DUPFD_CLOEXEC, far);
  if (moved < 0 && far != base) moved = real().fcntl(fd, F_DUPFD_CLOEXEC, base);
  real().close(fd);
  if (moved < 0) errno = EMFILE;
  own(moved);
  return moved;
}

int app_fd(int fd) noexcept {
  if (fd < g_app_end.load(std::memory_order_relaxed)) return fd;
  real().close(fd);
  errno = EMFILE;
  return -1;
}

bool app_number(int fd) noexcept {
  return fd < g_app_end.load(std::memory_order_relaxed);
}

namespace {

// Room for the library: an upgraded connection holds up to 9 descriptors (7
// on shm between processes of one user) of which one is the application's,
// and the library's engines hold a few more.
constexpr rlim_t kRoomPerFd = 9;
constexpr rlim_t kRoomSlack = 4096;
constexpr rlim_t kSmallLimit = 128;  // at or below: nothing moves
// Tells a preloaded child (exec inherits the raised limit) what its parent's
// application had: "APP:REAL", believed while the real soft limit is still REAL.
constexpr const char* kLimitEnv = "RDMAKIT_PRELOAD_APP_NOFILE";

}  // namespace

bool g_fd_limits_ready = false;

namespace {

std::mutex g_limit_mu;               // setters; readers load g_app_soft alone
std::atomic<rlim_t> g_app_soft{0};   // what the application set and sees; 0: never read
constexpr rlim_t kMinAppLimit = 16;  // an inherited claim below it is not believed

rlim_t room_for(rlim_t app, rlim_t hard) {
  if (app == RLIM_INFINITY || app >= hard || hard <= kRoomSlack) return hard;
  const rlim_t want =
      app > (hard - kRoomSlack) / kRoomPerFd ? hard : app * kRoomPerFd + kRoomSlack;
  return want < hard ? want : hard;
}

// Caller holds g_limit_mu; real_soft is the limit now in force.
void set_bases(rlim_t app, rlim_t real_soft) noexcept {
  int base = 0;
  int far = 0;
  if (real_soft != RLIM_INFINITY && app != RLIM_INFINITY && real_soft > kSmallLimit) {
    if (real_soft > app && app + kRoomSlack <= static_cast<rlim_t>(kMaxFd)) {
      base = static_cast<int>(app);  // room above the application's numbers
    } else {
      // No room to raise into (soft = hard), or an application limit past
      // the fd table: the top half of the numbers within the table (the
      // kernel TCP sockets of upgraded connections must be in it), the rest
      // past it when the real limit allows; once full, the library's calls
      // fail and connections stay on kernel TCP.
      const rlim_t half = real_soft / 2;
      base = static_cast<int>(half < kMaxFd / 2 ? half : kMaxFd / 2);
    }
    far = real_soft > static_cast<rlim_t>(kMaxFd) + kRoomSlack && base < kMaxFd ? kMaxFd
                                                                                : base;
  }
  g_base.store(base, std::memory_order_relaxed);
  g_far.store(far, std::memory_order_relaxed);
  const bool raised = real_soft != app && app < static_cast<rlim_t>(INT_MAX);
  g_app_end.store(raised ? static_cast<int>(app) : INT_MAX, std::memory_order_relaxed);
}

}  // namespace

void reserve_fd_room(bool at_load) noexcept {
  const std::lock_guard lock(g_limit_mu);
  rlimit lim{};
  if (sys_getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t app = lim.rlim_cur;
  if (const char* v = std::getenv(kLimitEnv)) {
    unsigned long long a = 0;
    unsigned long long r = 0;
    if (std::sscanf(v, "%llu:%llu", &a, &r) == 2 && r == lim.rlim_cur && a <= r &&
        a >= kMinAppLimit) {
      app = a;
    }
  }
  g_app_soft.store(app, std::memory_order_relaxed);
  rlimit raised{room_for(app, lim.rlim_max), lim.rlim_max};
  if (raised.rlim_cur != lim.rlim_cur && sys_setrlimit(RLIMIT_NOFILE, &raised) == 0) {
    lim = raised;
  }
  set_bases(app, lim.rlim_cur);
  g_fd_limits_ready = true;
  if (!at_load) return;
  // At load only: setenv races with getenv in other threads.
  char value[48];
  std::snprintf(value, sizeof value, "%llu:%llu", static_cast<unsigned long long>(app),
                static_cast<unsigned long long>(lim.rlim_cur));
  setenv(kLimitEnv, value, 1);
}

void show_app_fd_limit(rlimit* lim) noexcept {
  // No lock: a forked child of a threaded program may find it held.
  const rlim_t app = g_app_soft.load(std::memory_order_relaxed);
  if (app != 0 && app < lim->rlim_cur) lim->rlim_cur = app;
}

void restore_app_fd_limit() noexcept {
  const rlim_t app = g_app_soft.load(std::memory_order_relaxed);
  rlimit lim{};
  if (app == 0 || sys_getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur <= app) return;
  lim.rlim_cur = app;
  (void)sys_setrlimit(RLIMIT_NOFILE, &lim);
}

int set_app_fd_limit(const rlimit& want) noexcept {
  const std::lock_guard lock(g_limit_mu);
  if (want.rlim_cur > want.rlim_max) {
    errno = EINVAL;
    return -1;
  }
  const rlimit raised{room_for(want.rlim_cur, want.rlim_max), want.rlim_max};
  if (sys_setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    // The application's own request as it made it: the kernel's answer
    // (EPERM raising the hard limit, EINVAL past fs.nr_open) is its.
    if (sys_setrlimit(RLIMIT_NOFILE, &want) != 0) return -1;
    g_app_soft.store(want.rlim_cur, std::memory_order_relaxed);
    set_bases(want.rlim_cur, want.rlim_cur);
    return 0;
  }
  g_app_soft.store(want.rlim_cur, std::memory_order_relaxed);
  set_bases(want.rlim_cur, raised.rlim_cur);
  return 0;
}

}  // namespace rdmakit::preload
