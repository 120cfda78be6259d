#include "adoption.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "interruption.hpp"
#include "libc.hpp"
#include "process.hpp"
#include "rendezvous.hpp"

namespace rdmakit::preload {
namespace {

void write_marker(const AdoptionMarker& m, Holder h) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%c %d %llu\n", static_cast<char>(h),
                static_cast<int>(process_id()),
                static_cast<unsigned long long>(m.socket));
  write_file_whole(m.path, buf);
}

// Claims are made under one lock per rendezvous directory: reading the
// marker and writing the claim must be one step across processes. Waited
// for without blocking, until deadline (a holder stopped by a signal must
// not stop every other claim of the user): past it, the claim goes ahead
// unlocked. Released explicitly: a copy of the descriptor a fork made
// meanwhile would otherwise keep holding it.
class DirLock {
 public:
  DirLock(const std::string& marker_path,
          std::chrono::steady_clock::time_point deadline) {
    const std::string dir = marker_path.substr(0, marker_path.rfind('/'));
    fd_ = open((dir + "/a.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return;
    while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) ||
          std::chrono::steady_clock::now() >= deadline) {
        return;
      }
      (void)poll_through_signals(nullptr, 0, 1);
    }
    locked_ = true;
  }
  ~DirLock() {
    if (fd_ < 0) return;
    if (locked_) (void)flock(fd_, LOCK_UN);
    real().close(fd_);
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
  bool locked_ = false;
};

}  // namespace

AdoptionMarker adoption_marker_of(int tcp_fd, bool client) {
  AdoptionMarker m;
  struct stat st {};
  if (fstat(tcp_fd, &st) != 0) return m;
  m.path = adoption_marker(tcp_fd, client);
  m.socket = st.st_ino;
  return m;
}

Adoption read_adoption(const AdoptionMarker& m) {
  Adoption a;
  if (m.path.empty()) return a;
  const int fd = open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return a;
  char buf[64] = {};
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  char h = 0;
  int pid = 0;
  unsigned long long ino = 0;
  // Our own directory (0700, our uid), but read as any file: bounded parse.
  if (n <= 0 || std::sscanf(buf, "%c %d %llu", &h, &pid, &ino) != 3 || pid <= 0 ||
      ino != m.socket) {
    return a;
  }
  if (h != 'c' && h != 'o' && h != 'k') return a;
  a.holder = static_cast<Holder>(h);
  a.pid = pid;
  a.alive = alive(pid);
  return a;
}

bool claim_adoption(const AdoptionMarker& m,
                    std::chrono::steady_clock::time_point deadline, Adoption* other) {
  if (m.path.empty()) return true;
  for (;;) {
    {
      // The lock is held for a read and a write: worth a short wait even
      // for a claim that will not wait for another holder.
      const DirLock lock(m.path, std::max(deadline, std::chrono::steady_clock::now() +
                                                        std::chrono::milliseconds(100)));
      const Adoption a = read_adoption(m);
      if (a.holder == Holder::kNone || a.pid == process_id() ||
          (a.holder == Holder::kClaimed && !a.alive)) {
        write_marker(m, Holder::kClaimed);
        return true;
      }
      *other = a;
      if (a.holder != Holder::kClaimed) return false;
    }
    // Another holder is settling it now: a rendezvous takes milliseconds.
    if (std::chrono::steady_clock::now() >= deadline) return false;
    (void)poll_through_signals(nullptr, 0, 1);
  }
}

void mark_adoption(const AdoptionMarker& m, Holder outcome) {
  if (!m.path.empty()) write_marker(m, outcome);
}

}  // namespace rdmakit::preload
