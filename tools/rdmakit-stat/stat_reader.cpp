#include "stat_reader.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>

#include "preload/stat_format.hpp"

namespace rdmakit::stat_tool {

namespace ps = rdmakit::preload::stats;

namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<uint64_t>(ts.tv_nsec);
}

// A char array of the file as a string: at most its size, printable ASCII
// only (another user's file could hold terminal escapes).
std::string text(const char* p, size_t cap) {
  std::string s;
  for (size_t i = 0; i < cap && p[i] != '\0'; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    s.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  }
  return s;
}

// Field 22 of /proc/PID/stat (start time in clock ticks); 0 when unknown.
uint64_t start_ticks(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  return p == nullptr ? 0 : std::strtoull(p + 1, nullptr, 10);
}

// Whether pid is the process that made the file (not gone, not a reused pid).
bool alive(pid_t pid, uint64_t ticks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const uint64_t now = start_ticks(pid);
  return now == 0 || ticks == 0 || now == ticks;  // unknown: keep it
}

// "rdmakit-stat-<uid>-<pid>": both numbers, or false.
bool parse_name(const char* name, uid_t* uid, pid_t* pid) {
  const size_t plen = std::strlen(ps::kFilePrefix);
  if (std::strncmp(name, ps::kFilePrefix, plen) != 0) return false;
  unsigned long u = 0;  // NOLINT(google-runtime-int): sscanf's type
  int p = 0;
  int used = 0;
  if (std::sscanf(name + plen, "%lu-%d%n", &u, &p, &used) != 2 ||
      name[plen + static_cast<size_t>(used)] != '\0' || p <= 0) {
    return false;
  }
  *uid = static_cast<uid_t>(u);
  *pid = p;
  return true;
}

const char* path_name(uint8_t p) {
  switch (p) {
    case ps::kPathShm: return "shm";
    case ps::kPathVerbs: return "verbs";
    case ps::kPathTcp: return "tcp";
    case ps::kPathKernel: return "kernel";
    default: return nullptr;
  }
}

}  // namespace

std::optional<Process> read_file(const std::string& path, std::string* why, bool* stale) {
  *stale = false;
  const char* base = std::strrchr(path.c_str(), '/');
  base = base == nullptr ? path.c_str() : base + 1;
  uid_t name_uid = 0;
  pid_t name_pid = 0;
  if (!parse_name(base, &name_uid, &name_pid)) {
    *why = "not a statistics file name";
    return std::nullopt;
  }
  // O_NONBLOCK: a FIFO planted under the name must not hang the reader.
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *why = std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    *why = "not a regular file";
    return std::nullopt;
  }
  if (st.st_uid != name_uid) {
    close(fd);
    *why = "owner uid " + std::to_string(st.st_uid) + " is not the uid in its name";
    return std::nullopt;
  }
  if (static_cast<uint64_t>(st.st_size) != ps::kFileSize) {
    close(fd);
    *why = "size " + std::to_string(st.st_size) + ", expected " +
           std::to_string(ps::kFileSize);
    return std::nullopt;
  }
  // A private, aligned copy: the file may change (or be truncated) meanwhile;
  // nothing below looks at the file again.
  std::unique_ptr<ps::Header[]> buf(new ps::Header[ps::kFileSize / sizeof(ps::Header)]);
  static_assert(ps::kFileSize % sizeof(ps::Header) == 0);
  auto* bytes = reinterpret_cast<char*>(buf.get());  // NOLINT
  size_t got = 0;
  while (got < ps::kFileSize) {
    const ssize_t n =
        pread(fd, bytes + got, ps::kFileSize - got, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got != ps::kFileSize) {
    *why = "short read";
    return std::nullopt;
  }
  const ps::Header& h = buf[0];
  static constexpr char kZero[sizeof ps::kMagic] = {};
  if (std::memcmp(h.magic, kZero, sizeof kZero) == 0) {
    *why = "initialising";  // created, magic not written yet: skipped quietly
    return std::nullopt;
  }
  if (std::memcmp(h.magic, ps::kMagic, sizeof ps::kMagic) != 0) {
    *why = "bad magic (not a statistics file)";
    return std::nullopt;
  }
  if (h.version != ps::kVersion || h.header_size != ps::kHeaderSize ||
      h.slot_size != sizeof(ps::Slot) || h.slot_count != ps::kSlotCount ||
      h.reason_count != ps::kReasonCount) {
    *why = "unknown layout (version " + std::to_string(h.version) + ")";
    return std::nullopt;
  }
  if (h.pid != name_pid) {
    *why = "pid " + std::to_string(h.pid) + " is not the pid in its name";
    return std::nullopt;
  }
  if (!alive(name_pid, h.start_ticks)) {
    *stale = true;
    *why = "process " + std::to_string(name_pid) + " is gone";
    return std::nullopt;
  }
  constexpr auto r = std::memory_order_relaxed;
  Process p;
  p.pid = name_pid;
  p.uid = st.st_uid;
  p.file = path;
  p.program = text(h.program, sizeof h.program);
  p.upgrades_shm = h.upgrades_shm.load(r);
  p.upgrades_remote = h.upgrades_remote.load(r);
  p.fallbacks = h.fallbacks.load(r);
  p.unlisted = h.unlisted.load(r);
  p.reasons_other = h.reasons_other.load(r);
  p.tx_bytes = h.closed_tx_bytes.load(r);
  p.rx_bytes = h.closed_rx_bytes.load(r);
  p.tx_msgs = h.closed_tx_msgs.load(r);
  p.rx_msgs = h.closed_rx_msgs.load(r);
  for (const auto& rc : h.reasons) {
    if (rc.text[0] == '\0') continue;
    p.reasons.push_back({text(rc.text, sizeof rc.text), rc.count.load(r)});
  }
  const uint64_t now = now_ns();
  const auto* slots =
      reinterpret_cast<const ps::Slot*>(bytes + ps::kHeaderSize);  // NOLINT
  for (uint32_t i = 0; i < ps::kSlotCount; ++i) {
    const ps::Slot& s = slots[i];
    const uint32_t state = s.state.load(r);
    if (state != ps::kLive && state != ps::kClosed) continue;
    if (s.gen != s.gen_end) continue;  // being rewritten while copied
    const char* pn = path_name(s.path);
    if (pn == nullptr) continue;
    Connection c;
    c.fd = s.fd;
    c.side = s.side == ps::kSideAccept    ? "accept"
             : s.side == ps::kSideConnect ? "connect"
                                          : "?";
    c.path = pn;
    c.state = state == ps::kLive ? "live" : "closed";
    c.local = text(s.local, sizeof s.local);
    c.peer = text(s.peer, sizeof s.peer);
    c.reason = text(s.reason, sizeof s.reason);
    c.counted = s.counted != 0 && s.path != ps::kPathKernel;
    c.ring_bytes = s.ring_bytes;
    if (c.counted) {
      c.tx_bytes = s.tx_bytes.load(r);
      c.tx_msgs = s.tx_msgs.load(r);
      c.rx_bytes = s.rx_bytes.load(r);
      c.rx_msgs = s.rx_msgs.load(r);
      c.rx_peak = s.rx_peak.load(r);
      if (state == ps::kLive) {
        p.tx_bytes += c.tx_bytes;
        p.rx_bytes += c.rx_bytes;
        p.tx_msgs += c.tx_msgs;
        p.rx_msgs += c.rx_msgs;
      }
    }
    const uint64_t end = state == ps::kLive ? now : s.closed_ns.load(r);
    c.age_s = end > s.opened_ns ? static_cast<double>(end - s.opened_ns) / 1e9 : 0.0;
    p.connections.push_back(std::move(c));
  }
  std::sort(p.connections.begin(), p.connections.end(),
            [](const Connection& a, const Connection& b) {
              if (a.state != b.state) return a.state > b.state;  // live first
              return a.fd < b.fd;
            });
  return p;
}

Snapshot scan(const ScanOptions& opts) {
  Snapshot snap;
  DIR* d = opendir(opts.dir.c_str());
  if (d == nullptr) {
    snap.skipped.push_back({opts.dir, std::strerror(errno)});
    return snap;
  }
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, ps::kFilePrefix, std::strlen(ps::kFilePrefix)) == 0) {
      names.emplace_back(e->d_name);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    uid_t uid = 0;
    pid_t pid = 0;
    if (!parse_name(name.c_str(), &uid, &pid)) continue;
    if (!opts.pids.empty() &&
        std::find(opts.pids.begin(), opts.pids.end(), pid) == opts.pids.end()) {
      continue;
    }
    const std::string path = opts.dir + "/" + name;
    std::string why;
    bool stale = false;
    auto p = read_file(path, &why, &stale);
    if (p) {
      snap.processes.push_back(std::move(*p));
      continue;
    }
    if (stale) {
      // Another user's stale file is theirs to remove; ours is removed
      // (lstat again: only a regular file of ours, under that name).
      struct stat st {};
      if (opts.clean && lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          st.st_uid == geteuid() && unlink(path.c_str()) == 0) {
        snap.removed.push_back(path);
      }
      continue;  // a dead process has no connections
    }
    // Another user's (not ours to see), or one being created.
    if (why == std::strerror(EACCES) || why == "initialising") continue;
    snap.skipped.push_back({path, why});
  }
  return snap;
}

}  // namespace rdmakit::stat_tool
