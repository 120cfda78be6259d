#include "fd_place.hpp"

#include <fcntl.h>
#include <link.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstring>

#include "libc.hpp"

namespace rdmakit::preload {

namespace {

struct Range {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};
constexpr int kMaxRanges = 8;
Range g_ranges[kMaxRanges];
int g_nranges = 0;
int g_base = 0;

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
  rlimit lim{};
  // Half the descriptor limit, as the kernel TCP socket of an upgraded
  // connection; a small limit leaves no room and nothing moves.
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur > 128) {
    const rlim_t half = lim.rlim_cur == RLIM_INFINITY ? 8192 : lim.rlim_cur / 2;
    g_base = static_cast<int>(half < 8192 ? half : 8192);
  }
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

int high_base() noexcept { return g_base; }

int place_high(int fd) noexcept {
  if (fd < 0 || g_base == 0 || fd >= g_base) return fd;
  const int moved = real().fcntl(fd, F_DUPFD_CLOEXEC, g_base);
  if (moved < 0) return fd;
  real().close(fd);
  return moved;
}

}  // namespace rdmakit::preload
