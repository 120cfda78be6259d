// RLIMIT_NOFILE as the application set it (fd_place.hpp): the real soft
// limit has room above it for the library's descriptors. Other resources,
// and other processes' limits, pass straight through.
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fd_place.hpp"
#include "hook.hpp"
#include "libc.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

static_assert(sizeof(rlimit) == sizeof(rlimit64), "one layout for both");

namespace {
bool own_nofile(pid_t pid, int resource) {
  return resource == RLIMIT_NOFILE && (pid == 0 || pid == getpid());
}

int get_limit(pid_t pid, int resource, rlimit* lim) {
  const int r = sys_prlimit(pid, resource, nullptr, lim);
  if (r == 0 && own_nofile(pid, resource)) show_app_fd_limit(lim);
  return r;
}

int set_limit(pid_t pid, int resource, const rlimit* want, rlimit* old) {
  if (!own_nofile(pid, resource)) {
    return sys_prlimit(pid, resource, want, old);
  }
  rlimit before{};
  if (old != nullptr && get_limit(0, resource, &before) != 0) return -1;
  if (want != nullptr && set_app_fd_limit(*want) != 0) return -1;
  if (old != nullptr) *old = before;
  return 0;
}
}  // namespace

// Before the library has loaded (a sanitizer runtime preloaded first sets
// its limits while it starts, before this library's code, instrumented,
// may run): straight to the system call. The hooks themselves are not
// instrumented for that moment.
#define RDMAKIT_EARLY __attribute__((no_sanitize("address", "undefined")))

EXPORT RDMAKIT_EARLY int getrlimit(__rlimit_resource_t resource, rlimit* lim) {
  if (!g_fd_limits_ready) return sys_prlimit(0, resource, nullptr, lim);
  return get_limit(0, resource, lim);
}

EXPORT RDMAKIT_EARLY int getrlimit64(__rlimit_resource_t resource, rlimit64* lim) {
  auto* l = reinterpret_cast<rlimit*>(lim);  // NOLINT: one layout (above)
  if (!g_fd_limits_ready) return sys_prlimit(0, resource, nullptr, l);
  return get_limit(0, resource, l);
}

EXPORT RDMAKIT_EARLY int setrlimit(__rlimit_resource_t resource, const rlimit* lim) {
  if (!g_fd_limits_ready) return sys_prlimit(0, resource, lim, nullptr);
  return set_limit(0, resource, lim, nullptr);
}

EXPORT RDMAKIT_EARLY int setrlimit64(__rlimit_resource_t resource, const rlimit64* lim) {
  const auto* l = reinterpret_cast<const rlimit*>(lim);  // NOLINT: one layout (above)
  if (!g_fd_limits_ready) return sys_prlimit(0, resource, l, nullptr);
  return set_limit(0, resource, l, nullptr);
}

EXPORT RDMAKIT_EARLY int prlimit(pid_t pid, __rlimit_resource resource,
                                 const rlimit* want, rlimit* old) {
  if (!g_fd_limits_ready) return sys_prlimit(pid, resource, want, old);
  if (want == nullptr) return get_limit(pid, resource, old);
  return set_limit(pid, resource, want, old);
}

// The number of descriptors a program may open, which daemons loop up to
// when they close every one: the application's limit (glibc answers both
// from its own getrlimit, which is not interposed).
EXPORT RDMAKIT_EARLY long sysconf(int name) {
  static auto* const libc_sysconf =
      reinterpret_cast<long (*)(int)>(dlsym(RTLD_NEXT, "sysconf"));  // NOLINT
  if (name == _SC_OPEN_MAX && g_fd_limits_ready) {
    rlimit lim{};
    if (get_limit(0, RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
      return static_cast<long>(lim.rlim_cur);
    }
  }
  return libc_sysconf(name);
}

EXPORT RDMAKIT_EARLY int getdtablesize() {
  return static_cast<int>(sysconf(_SC_OPEN_MAX));
}

EXPORT RDMAKIT_EARLY int prlimit64(pid_t pid, __rlimit_resource resource,
                                   const rlimit64* want, rlimit64* old) {
  return prlimit(pid, resource, reinterpret_cast<const rlimit*>(want),  // NOLINT
                 reinterpret_cast<rlimit*>(old));                       // NOLINT
}
