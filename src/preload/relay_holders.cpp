// Whether another process holds a connection this one carries
// (relay_holders.hpp).
#include "relay_holders.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "state.hpp"

namespace rdmakit::preload {

namespace {

// Whether a process other than this one has a descriptor for either inode
// (the readiness socket or the kernel TCP socket of a connection). Reads
// /proc: only when a shared connection's last local copy closes.
bool held_by_other_process(ino_t a, ino_t b) {
  DIR* procs = opendir("/proc");
  if (procs == nullptr) return false;
  bool found = false;
  const pid_t self = getpid();
  while (!found) {
    dirent* e = readdir(procs);
    if (e == nullptr) break;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/fd", pid);
    DIR* fds = opendir(path);
    if (fds == nullptr) continue;  // gone, or another user's
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] != '.' && proc_fd_names_socket(pid, f->d_name, a, b)) {
        found = true;
        break;
      }
    }
    closedir(fds);
  }
  closedir(procs);
  return found;
}

}  // namespace

bool proc_fd_names_socket(long pid, const char* fd, ino_t a, ino_t b) {
  char link[320];
  char target[64];
  std::snprintf(link, sizeof link, "/proc/%ld/fd/%s", pid, fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  unsigned long long ino = 0;
  char tail = 0;
  return std::sscanf(target, "socket:[%llu%c", &ino, &tail) == 2 && tail == ']' &&
         (ino == a || ino == b);
}

// Copies of the readiness socket are what processes that got the
// connection after its upgrade hold (forked children, exec'd images,
// receivers of SCM_RIGHTS): they relay it. A copy of the kernel TCP socket
// alone is a process that never used it: a listener's copy from before the
// fork does not keep the connection open here, but a forked copy of a
// connect()ed one does (its first use follows this process: handoff.hpp).
bool held_elsewhere(Conn& c) {
  struct stat ready {};
  const int rfd = c.stream ? c.stream->fd() : -1;
  if (rfd < 0 || fstat(rfd, &ready) != 0) return false;
  struct stat kernel {};
  const bool kernel_too = c.kernel_copies_follow.load(std::memory_order_acquire) &&
                          c.tcp_fd >= 0 && fstat(c.tcp_fd, &kernel) == 0;
  return held_by_other_process(ready.st_ino, kernel_too ? kernel.st_ino : ready.st_ino);
}

}  // namespace rdmakit::preload
