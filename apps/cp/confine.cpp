#include "confine.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rdmakit::cp {

namespace {

long sys_openat2(int dirfd, const char* path, open_how* how) {
  return ::syscall(SYS_openat2, dirfd, path, how, sizeof(*how));
}

struct Probe {
  bool ok = false;
  std::string why;
  Probe() {
    if (const char* v = std::getenv("RDMAKIT_CP_NO_OPENAT2"); v != nullptr && *v == '1') {
      why = "per-component O_NOFOLLOW walk (openat2 disabled by RDMAKIT_CP_NO_OPENAT2=1)";
      std::fprintf(stderr, "rdmakit-cp: path confinement: %s\n", why.c_str());
      return;
    }
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const long fd = sys_openat2(AT_FDCWD, ".", &how);
    if (fd >= 0) {
      ::close(static_cast<int>(fd));
      ok = true;
      why = "openat2(RESOLVE_BENEATH)";
    } else {
      why = std::string("per-component O_NOFOLLOW walk (openat2 unavailable: ") +
            std::strerror(errno) + ")";
      std::fprintf(stderr, "rdmakit-cp: path confinement: %s\n", why.c_str());
    }
  }
};

const Probe& probe() {
  static const Probe p;
  return p;
}

// The errno of a walk step that could not open comp in dir (err): a
// symlinked directory could lead anywhere, so the ENOTDIR that O_DIRECTORY
// gives on one is refused as an escape.
int walk_errno(int dir, const std::string& comp, int err) {
  struct stat st {};
  if (err == ENOTDIR && ::fstatat(dir, comp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(st.st_mode))
    return EXDEV;
  return err;
}

}  // namespace

bool have_openat2() { return probe().ok; }
const char* confinement_method() { return probe().why.c_str(); }

std::string check_relative(std::string_view path) {
  if (path.empty()) return "empty path";
  if (path.front() == '/') return "absolute paths are refused";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view comp = path.substr(start, end - start);
    if (comp == "..") return "'..' components are refused";
    if (comp.empty() && end != path.size()) return "empty path component";
    start = end + 1;
  }
  return "";
}

std::pair<std::string, std::string> split_parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

int open_beneath(int dirfd, const std::string& path, int flags, unsigned mode) {
  if (path.empty() || path.front() == '/') return -EXDEV;
  if (have_openat2()) {
    open_how how{};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const long fd = sys_openat2(dirfd, path.c_str(), &how);
    return fd >= 0 ? static_cast<int>(fd) : -errno;
  }
  if (!check_relative(path).empty()) return -EXDEV;
  // Fallback: walk each directory component without following symlinks.
  int cur = ::openat(dirfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0) return -errno;
  size_t start = 0;
  while (true) {
    const size_t end = path.find('/', start);
    const std::string comp =
        path.substr(start, end == std::string::npos ? end : end - start);
    if (end == std::string::npos) {
      // The last component is never followed either, whatever the caller
      // asked: a symlink there is refused as an escape (O_NOFOLLOW gives
      // ELOOP, or ENOTDIR with O_DIRECTORY; O_PATH opens the link itself).
      const int fd = ::openat(cur, comp.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
      const int err = fd < 0 ? walk_errno(cur, comp, errno) : 0;
      ::close(cur);
      struct stat st {};
      if (fd >= 0 && (flags & O_PATH) && ::fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
        ::close(fd);
        return -EXDEV;
      }
      return fd >= 0 ? fd : (err == ELOOP ? -EXDEV : -err);
    }
    start = end + 1;
    if (comp.empty() || comp == ".") continue;  // (check_relative refused "..")
    const int next =
        ::openat(cur, comp.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = next < 0 ? walk_errno(cur, comp, errno) : 0;
    ::close(cur);
    if (next < 0) return -err;
    cur = next;
  }
}

}  // namespace rdmakit::cp
