#include "providers/shm/shm_asymmetric_fence.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace rdmakit::shm {
namespace {

long membarrier(int cmd) noexcept { return ::syscall(SYS_membarrier, cmd, 0, 0); }

bool register_once() noexcept {
  const long supported = membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || (supported & MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0) {
    core::log().info(
        "shm: membarrier(GLOBAL_EXPEDITED) unavailable ({}); completions use a full "
        "fence per message",
        supported < 0 ? std::strerror(errno) : "not offered by the kernel");
    return false;
  }
  if (membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0) {
    core::log().info(
        "shm: membarrier registration failed ({}); completions use a full fence per "
        "message",
        std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace

bool asymmetric_fence_available() noexcept {
  static const bool available = register_once();
  return available;
}

namespace {
// Registered when the library is loaded rather than at the first CQ: the
// kernel makes a process with more than one thread wait for an RCU grace
// period to register (milliseconds, measured ~5 ms, paid by the first
// connection of a preloaded server), and most processes load the library
// while they have one thread.
[[gnu::constructor]] void register_at_load() noexcept {
  (void)asymmetric_fence_available();
}
}  // namespace

void heavy_fence() noexcept { membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED); }

}  // namespace rdmakit::shm
