#include "stat.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <new>

#include "libc.hpp"
#include "process.hpp"
#include "stale_files.hpp"
#include "state.hpp"

namespace rdmakit::preload::stats {

namespace {

std::mutex g_mu;
Header* g_hdr = nullptr;         // under g_mu; nullptr: not (yet) published
bool g_tried = false;            // under g_mu: created, or given up
pid_t g_owner = 0;               // the process that created g_path
char g_path[256] = "";           // removed at exit by g_owner
uint32_t g_cursor = 0;           // next slot to look at (round robin)
std::atomic<Slot*>* g_fd_slots;  // kernel-TCP slots by fd (allocated at first use)

uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<uint64_t>(ts.tv_nsec);
}

void copy_str(char* dst, size_t cap, const char* src) noexcept {
  std::strncpy(dst, src, cap - 1);
  dst[cap - 1] = '\0';
}

uint64_t start_ticks() {
  char buf[1024];
  const int fd = real().open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  // Fields after the name: 3 (state) .. 22 (starttime).
  for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  return p == nullptr ? 0 : std::strtoull(p + 1, nullptr, 10);
}

void remove_at_exit() {
  if (g_owner == getpid() && g_path[0] != '\0') unlink(g_path);
}

// Files of this uid's processes that are gone (killed by a signal: no
// atexit ran) are removed, so they do not pile up between runs of
// rdmakit-stat, which removes them too.
void remove_stale(const char* dir) {
  char prefix[64];
  const int plen = std::snprintf(prefix, sizeof prefix, "%s%u-", kFilePrefix,
                                 static_cast<unsigned>(geteuid()));
  remove_stale_entries(dir, [&](const char* name, const struct stat& st) {
    if (std::strncmp(name, prefix, static_cast<size_t>(plen)) != 0 ||
        !S_ISREG(st.st_mode))
      return false;
    char* end = nullptr;
    const long pid = std::strtol(name + plen, &end, 10);
    return end != nullptr && *end == '\0' && pid > 0 && pid != process_id() &&
           kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
  });
}

bool enabled() {
  const char* v = std::getenv("RDMAKIT_PRELOAD_STAT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Creates and maps the file (under g_mu). Failures are logged once; the
// process then runs unpublished.
Header* publish() {
  if (g_hdr != nullptr || g_tried) return g_hdr;
  g_tried = true;
  if (!enabled()) return nullptr;
  const char* dir = std::getenv("RDMAKIT_PRELOAD_STAT_DIR");
  if (dir == nullptr || *dir == '\0') dir = kDefaultDir;
  const pid_t pid = process_id();
  std::snprintf(g_path, sizeof g_path, "%s/%s%u-%d", dir, kFilePrefix,
                static_cast<unsigned>(geteuid()), static_cast<int>(pid));
  int fd = -1;
  for (int attempt = 0; attempt < 2 && fd < 0; ++attempt) {
    fd = real().open(g_path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST || attempt > 0) break;
    // Left by an earlier process of this pid (this one has not made it):
    // ours to replace; anyone else's is a squatter, and we stay unpublished.
    struct stat st {};
    if (lstat(g_path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      errno = EEXIST;
      break;
    }
    unlink(g_path);
  }
  if (fd < 0) {
    log_line("stat: cannot create %s: %s (connections not published)", g_path,
             std::strerror(errno));
    g_path[0] = '\0';
    return nullptr;
  }
  void* m = MAP_FAILED;
  if (fchmod(fd, 0600) == 0 && ftruncate(fd, static_cast<off_t>(kFileSize)) == 0) {
    m = mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  real().close(fd);
  if (m == MAP_FAILED) {
    log_line("stat: cannot map %s: %s (connections not published)", g_path,
             std::strerror(err));
    unlink(g_path);
    g_path[0] = '\0';
    return nullptr;
  }
  auto* h = static_cast<Header*>(m);  // the file is all zeroes
  h->version = kVersion;
  h->header_size = kHeaderSize;
  h->slot_size = sizeof(Slot);
  h->slot_count = kSlotCount;
  h->pid = static_cast<int32_t>(pid);
  h->reason_count = kReasonCount;
  h->start_ticks = start_ticks();
  copy_str(h->program, sizeof h->program, launch_name());
  // The magic last, by a release store: a reader that sees it sees the
  // header filled in (an atomic store, where a fence would not be
  // understood by the thread sanitizer).
  uint64_t magic;
  std::memcpy(&magic, kMagic, sizeof magic);
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(h->magic))
      .store(magic, std::memory_order_release);
  g_owner = pid;
  static bool registered = false;
  if (!registered) {
    registered = true;
    std::atexit(remove_at_exit);
  }
  g_hdr = h;
  remove_stale(dir);
  return h;
}

Slot* slots(Header* h) {
  return reinterpret_cast<Slot*>(reinterpret_cast<char*>(h) + kHeaderSize);  // NOLINT
}

// A free slot (never used, else the next closed one round robin), filled
// with d's fixed fields and shown live; under g_mu.
Slot* claim(Header* h, const Decision& d) {
  Slot* all = slots(h);
  Slot* s = nullptr;
  for (uint32_t i = 0; i < kSlotCount && s == nullptr; ++i) {
    Slot& c = all[(g_cursor + i) % kSlotCount];
    const uint32_t st = c.state.load(std::memory_order_relaxed);
    if (st == kEmpty || st == kClosed) {
      s = &c;
      g_cursor = (g_cursor + i + 1) % kSlotCount;
    }
  }
  if (s == nullptr) {
    h->unlisted.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  // Busy before any field changes: the acquire half keeps the writes
  // below after it.
  s->state.exchange(kBusy, std::memory_order_acq_rel);
  s->gen = s->gen + 1;
  s->fd = d.fd;
  s->path = d.path;
  s->side = d.side;
  s->counted = d.path == kPathKernel ? 0 : 1;
  s->opened_ns = now_ns();
  s->closed_ns.store(0, std::memory_order_relaxed);
  s->ring_bytes = d.ring_bytes;
  copy_str(s->local, sizeof s->local, d.local.c_str());
  copy_str(s->peer, sizeof s->peer, d.peer.c_str());
  copy_str(s->reason, sizeof s->reason, d.reason);
  s->tx_bytes.store(0, std::memory_order_relaxed);
  s->tx_msgs.store(0, std::memory_order_relaxed);
  s->rx_bytes.store(0, std::memory_order_relaxed);
  s->rx_msgs.store(0, std::memory_order_relaxed);
  s->rx_peak.store(0, std::memory_order_relaxed);
  s->gen_end = s->gen;
  s->state.store(kLive, std::memory_order_release);
  return s;
}

// Under g_mu. Only a slot of this process's own file (a fork child's copies
// of its parent's connections are never released).
void release_locked(Slot* s) noexcept {
  if (g_hdr == nullptr) return;
  const auto first = reinterpret_cast<uintptr_t>(slots(g_hdr));  // NOLINT
  const auto at = reinterpret_cast<uintptr_t>(s);                // NOLINT
  if (at < first || at >= first + sizeof(Slot) * kSlotCount) return;
  if (s->counted != 0) {
    bump(g_hdr->closed_tx_bytes, s->tx_bytes.load(std::memory_order_relaxed));
    bump(g_hdr->closed_rx_bytes, s->rx_bytes.load(std::memory_order_relaxed));
    bump(g_hdr->closed_tx_msgs, s->tx_msgs.load(std::memory_order_relaxed));
    bump(g_hdr->closed_rx_msgs, s->rx_msgs.load(std::memory_order_relaxed));
  }
  s->closed_ns.store(now_ns(), std::memory_order_relaxed);
  s->state.store(kClosed, std::memory_order_release);
}

void count_reason(Header* h, const char* reason) {
  for (auto& r : h->reasons) {
    if (r.text[0] == '\0') {
      copy_str(r.text, sizeof r.text, reason);
    } else if (std::strncmp(r.text, reason, sizeof r.text - 1) != 0) {
      continue;
    }
    r.count.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  h->reasons_other.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

Slot* claim_upgraded(const Decision& d) {
  std::lock_guard lock(g_mu);
  Header* h = publish();
  if (h == nullptr) return nullptr;
  (d.path == kPathShm ? h->upgrades_shm : h->upgrades_remote)
      .fetch_add(1, std::memory_order_relaxed);
  return claim(h, d);
}

void note_fallback(const Decision& d) {
  std::lock_guard lock(g_mu);
  Header* h = publish();
  if (h == nullptr) return;
  h->fallbacks.fetch_add(1, std::memory_order_relaxed);
  count_reason(h, d.reason);
  Slot* s = claim(h, d);
  if (s == nullptr || d.fd < 0 || d.fd >= kMaxFd) {
    if (s != nullptr) release_locked(s);
    return;
  }
  if (g_fd_slots == nullptr) {
    g_fd_slots = new (std::nothrow) std::atomic<Slot*>[kMaxFd]();
    if (g_fd_slots == nullptr) {
      release_locked(s);
      return;
    }
  }
  if (Slot* old = g_fd_slots[d.fd].exchange(s); old != nullptr) release_locked(old);
}

void release(Slot* s) noexcept {
  if (s == nullptr) return;
  std::lock_guard lock(g_mu);
  release_locked(s);
}

void forget_fd(int fd) noexcept {
  std::atomic<Slot*>* t = g_fd_slots;
  if (t == nullptr || fd < 0 || fd >= kMaxFd) return;
  if (t[fd].load(std::memory_order_relaxed) == nullptr) return;
  release(t[fd].exchange(nullptr));
}

void lock_for_fork() noexcept { g_mu.lock(); }
void unlock_after_fork() noexcept { g_mu.unlock(); }

void drop_in_child() noexcept {
  // The mapping stays (the parent's connections copied here point into it
  // and are never used); this process publishes its own file when it
  // decides about a connection of its own.
  g_hdr = nullptr;
  g_tried = false;
  g_cursor = 0;
  // The parent's kernel-TCP slots are not this process's to release: its
  // table copy is dropped (not cleared: no page of it is touched here).
  g_fd_slots = nullptr;
}

}  // namespace rdmakit::preload::stats
