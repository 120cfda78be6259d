#include "stale_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <vector>

#include "fd_place.hpp"
#include "libc.hpp"
#include "rendezvous.hpp"
#include "rendezvous_users.hpp"
#include "sock_diag.hpp"
#include "state.hpp"

namespace rdmakit::preload {

namespace {

// A file changed this recently may belong to a process that is making it
// now (a marker for a socket younger than the kernel's answer, a
// registration a reused pid is writing): left for the next sweep.
constexpr time_t kSettleSeconds = 2;
constexpr int64_t kSweepEverySeconds = 60;

std::atomic<int64_t> g_last_sweep{INT64_MIN};

// The file's first line, at most 63 bytes ("" when unreadable).
std::string first_bytes(const std::string& path) {
  char buf[64] = {};
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A decimal pid that ends the text or a line; 0 otherwise.
pid_t parse_pid(const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || (*end != '\0' && *end != '\n') || v <= 0 || v > INT32_MAX) return 0;
  return static_cast<pid_t>(v);
}

bool gone(pid_t pid) { return pid > 0 && !alive(pid); }

// "<anything>.tmp<pid>": write_file_whole's and the registrations' names
// before their rename.
bool half_written_by_gone(const char* name) {
  const char* tmp = std::strstr(name, ".tmp");
  return tmp != nullptr && gone(parse_pid(tmp + 4));
}

bool hex_name(const char* name, char kind) {
  if (name[0] != kind || name[1] != '-' || std::strlen(name + 2) != 16) return false;
  return std::all_of(name + 2, name + 18, [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// The paths bound to unix sockets of this network namespace, sorted;
// nullopt when /proc/net/unix cannot be read.
std::optional<std::vector<std::string>> bound_unix_paths() {
  FILE* f = std::fopen("/proc/net/unix", "re");
  if (f == nullptr) return std::nullopt;
  std::vector<std::string> paths;
  char line[4096 + 128];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    // Num RefCount Protocol Flags Type St Inode [Path]: the path is the
    // rest of the line (it may hold spaces).
    int at = 0;
    if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %*s %n", &at) != 0 || at <= 0)
      continue;
    std::string path(line + at);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (!path.empty() && path[0] == '/') paths.push_back(std::move(path));
  }
  std::fclose(f);
  std::sort(paths.begin(), paths.end());
  return paths;
}

void sweep_private(const std::string& dir, time_t settled) {
  // The kernel's tables are read after `settled`: a marker or socket file
  // older than it names a socket made before them.
  const auto inodes = tcp_socket_inodes();
  const auto bound = bound_unix_paths();
  remove_stale_entries(dir, [&](const char* name, const struct stat& st) {
    if (st.st_mtim.tv_sec >= settled) return false;
    if (half_written_by_gone(name)) return true;
    const std::string path = dir + "/" + name;
    if (name[0] == 'l' && name[1] == '-') {
      return S_ISREG(st.st_mode) && gone(parse_pid(first_bytes(path).c_str()));
    }
    if (hex_name(name, 'o')) {
      return S_ISSOCK(st.st_mode) && bound &&
             !std::binary_search(bound->begin(), bound->end(), path);
    }
    if (hex_name(name, 'a') || hex_name(name, 'b')) {
      // "<holder> <pid> <socket inode>" (adoption.cpp)
      unsigned long long ino = 0;
      return S_ISREG(st.st_mode) && inodes &&
             std::sscanf(first_bytes(path).c_str(), "%*c %*d %llu", &ino) == 1 &&
             !std::binary_search(inodes->begin(), inodes->end(), static_cast<ino_t>(ino));
    }
    return false;
  });
}

void sweep_host(const std::string& prefix, time_t settled) {
  const auto slash = prefix.rfind('/');
  const std::string dir = prefix.substr(0, slash);
  const std::string base = prefix.substr(slash + 1);
  remove_stale_entries(dir, [&](const char* name, const struct stat& st) {
    if (std::strncmp(name, base.c_str(), base.size()) != 0 || !S_ISREG(st.st_mode) ||
        st.st_mtim.tv_sec >= settled) {
      return false;
    }
    return half_written_by_gone(name) ||
           gone(parse_pid(first_bytes(dir + "/" + name).c_str()));
  });
}

}  // namespace

void remove_stale_entries(
    const std::string& dir,
    const std::function<bool(const char*, const struct stat&)>& stale) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const uid_t me = geteuid();
  std::vector<std::string> doomed;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || st.st_uid != me ||
        !(S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode))) {
      continue;
    }
    if (stale(e->d_name, st)) doomed.push_back(path);
  }
  closedir(d);
  for (const auto& path : doomed) unlink(path.c_str());
}

void sweep_stale_files() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t last = g_last_sweep.load(std::memory_order_relaxed);
  if (last != INT64_MIN && now.tv_sec - last < kSweepEverySeconds) return;
  if (!g_last_sweep.compare_exchange_strong(last, now.tv_sec)) return;
  const InternalScope internal;
  const time_t settled = std::time(nullptr) - kSettleSeconds;
  if (config().dir_problem.empty()) sweep_private(config().dir, settled);
  if (const std::string prefix = host_registration_prefix(); !prefix.empty()) {
    sweep_host(prefix, settled);
  }
}

}  // namespace rdmakit::preload
