#include "use_watch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fd_place.hpp"
#include "handoff.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "rdmakit/detail/library_thread.hpp"
#include "rendezvous_wire.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

using Clock = std::chrono::steady_clock;

// Often at first (a program reads soon after it starts), then less.
constexpr auto kFastPeriod = std::chrono::microseconds(300);
constexpr auto kFastFor = std::chrono::milliseconds(50);
constexpr auto kSlowPeriod = std::chrono::milliseconds(4);
constexpr int kWatchSeconds = 30;

std::atomic<bool> g_stop{false};
std::atomic<bool> g_running{false};
pid_t g_watch_pid =
    0;  // the process whose thread it is (fork copies the flags, not the thread)

bool reads(long nr) {
  return nr == SYS_read || nr == SYS_readv || nr == SYS_recvfrom || nr == SYS_recvmsg ||
         nr == SYS_pread64;
}

// The main thread's /proc/self/task/TID/syscall, opened at load and read
// again with pread: the watch opens no descriptor later, when a program
// arranging its own numbers (sshd's dup2 onto fixed ones, closefrom) could
// meet it. Inetd-style programs read on their main thread.
int g_syscall_fd = -1;
struct stat g_syscall_st {
};  // a program's closefrom() may close it; its number then names another file

// The descriptor the main thread is blocked reading, or -1 (running,
// another call, or unreadable).
int blocked_read() {
  struct stat st {};
  if (fstat(g_syscall_fd, &st) != 0 || st.st_dev != g_syscall_st.st_dev ||
      st.st_ino != g_syscall_st.st_ino) {
    return -1;
  }
  char buf[160];
  const ssize_t n = real().pread(g_syscall_fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char* end = nullptr;
  const long nr = std::strtol(buf, &end, 10);
  if (end == buf || !reads(nr)) return -1;
  const unsigned long fd = std::strtoul(end, nullptr, 16);  // "0x..." arguments
  return fd < static_cast<unsigned long>(kMaxFd) ? static_cast<int>(fd) : -1;
}

void look() {
  const int fd = blocked_read();
  if (fd >= 0 && entry_of(fd) == Entry::kPending) {
    settle_on_kernel(fd, "read outside the library (stdio or a raw system call)",
                     wire::kUsedOutside);
  }
}

void run(Clock::time_point until) {
  struct Running {
    ~Running() { g_running.store(false, std::memory_order_release); }
  } running;
  const auto start = Clock::now();
  while (!g_stop.load(std::memory_order_relaxed) && any_pending() &&
         Clock::now() < until) {
    std::this_thread::sleep_for(
        Clock::now() - start < kFastFor
            ? std::chrono::duration_cast<Clock::duration>(kFastPeriod)
            : std::chrono::duration_cast<Clock::duration>(kSlowPeriod));
    try {
      look();
    } catch (...) {
      return;  // out of memory: the clients wait their budget, as without the watch
    }
  }
}

// At exit: the thread stops before the library's state goes (a few
// milliseconds at most, one look).
void stop_watch() {
  if (getpid() != g_watch_pid) return;
  g_stop.store(true, std::memory_order_relaxed);
  for (int i = 0; i < 1000 && g_running.load(std::memory_order_acquire); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

void watch_inherited_use() noexcept {
  if (!any_pending() || g_watch_pid != 0) return;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall",
                static_cast<int>(getpid()));
  g_syscall_fd = place_high(real().open(path, O_RDONLY | O_CLOEXEC));
  if (g_syscall_fd < 0) return;  // not readable (a non-dumpable process): no watch
  if (fstat(g_syscall_fd, &g_syscall_st) != 0) return;
  // The longest budget a client may wait. Not config(): reading it opens the
  // log now, at load, where a program's closefrom() would close it.
  const auto until = Clock::now() + std::chrono::seconds(kWatchSeconds);
  try {
    g_running.store(true, std::memory_order_relaxed);
    g_watch_pid = getpid();
    rdmakit::detail::start_library_thread([until] { run(until); }).detach();
    std::atexit(stop_watch);
  } catch (...) {
    g_running.store(false, std::memory_order_relaxed);
    // No thread: the clients wait their budget, as without the watch.
  }
}

}  // namespace rdmakit::preload
