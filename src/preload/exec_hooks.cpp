// The exec family (docs/preload.md, "Process shapes"). A new image that
// loads this library takes its connections over itself; one that will not
// (its environment drops LD_PRELOAD, as systemd-socket-activate's and
// `env -i`'s do, or the kernel ignores LD_PRELOAD for a setuid or
// file-capability program) gets them settled first: a connection no process
// has used stays on kernel TCP with its client told at once, another
// process's becomes a relay socket. Otherwise the client would wait out its
// rendezvous budget for an answer no one gives, and a dormant relay would
// never start.
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <string>

#include "handoff.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "process.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

constexpr size_t kMaxExecArgs = 1024;  // execl* arguments, on the stack

bool preloaded(char* const envp[]) {
  if (envp == nullptr) return false;
  for (char* const* e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0) {
      return std::strstr(*e + 11, "librdmakit-preload") != nullptr;
    }
  }
  return false;
}

// Whether the kernel runs path in secure mode (the loader then ignores
// LD_PRELOAD).
bool secure_program(const std::string& path) {
  struct stat st {};
  if (path.empty() || stat(path.c_str(), &st) != 0) return false;
  if ((st.st_mode & (S_ISUID | S_ISGID)) != 0) return true;
  return getxattr(path.c_str(), "security.capability", nullptr, 0) > 0;
}

// execvp's search: the file it would run, or empty.
std::string resolve(const char* file) {
  if (file == nullptr || *file == '\0') return {};
  if (std::strchr(file, '/') != nullptr) return file;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/bin:/usr/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string full = (dir.empty() ? std::string(".") : dir) + "/" + file;
    if (access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  return {};
}

// A vfork child (no fork handlers ran, so the pid differs) shares the
// parent's memory: it must not allocate or touch the tables. Its
// connections reach the new image as they are.
bool vfork_child() { return getpid() != process_id(); }

void before_exec(const std::string& program, char* const envp[]) {
  if (!preloaded(envp)) {
    settle_for_plain_exec(
        "passed across exec to a program whose environment has no LD_PRELOAD");
  } else if (secure_program(program)) {
    settle_for_plain_exec(
        "passed across exec to a setuid, setgid or file-capability program (no "
        "LD_PRELOAD)");
  }
}

// execl's arguments, up to the terminating null pointer, on the stack (the
// caller may be a vfork child): false if there are more than fit.
bool collect(const char* arg0, va_list ap, char** argv, size_t room) {
  size_t n = 0;
  argv[n++] = const_cast<char*>(arg0);  // NOLINT: exec's own signature
  while (argv[n - 1] != nullptr) {
    if (n == room) return false;
    argv[n++] = va_arg(ap, char*);
  }
  return true;
}

}  // namespace

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  if (!vfork_child()) before_exec(path, envp);
  return real().execve(path, argv, envp);
}

EXPORT int execv(const char* path, char* const argv[]) {
  if (!vfork_child()) before_exec(path, environ);
  return real().execv(path, argv);
}

EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  if (!vfork_child()) before_exec(resolve(file), envp);
  return real().execvpe(file, argv, envp);
}

EXPORT int execvp(const char* file, char* const argv[]) {
  if (!vfork_child()) before_exec(resolve(file), environ);
  return real().execvp(file, argv);
}

EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  if (!vfork_child()) before_exec("", envp);
  return real().fexecve(fd, argv, envp);
}

EXPORT int execl(const char* path, const char* arg, ...) {
  char* argv[kMaxExecArgs];
  va_list ap;
  va_start(ap, arg);
  const bool fits = collect(arg, ap, argv, kMaxExecArgs);
  va_end(ap);
  if (!fits) {
    errno = E2BIG;
    return -1;
  }
  return execv(path, argv);
}

EXPORT int execlp(const char* file, const char* arg, ...) {
  char* argv[kMaxExecArgs];
  va_list ap;
  va_start(ap, arg);
  const bool fits = collect(arg, ap, argv, kMaxExecArgs);
  va_end(ap);
  if (!fits) {
    errno = E2BIG;
    return -1;
  }
  return execvp(file, argv);
}

EXPORT int execle(const char* path, const char* arg, ...) {
  char* argv[kMaxExecArgs];
  va_list ap;
  va_start(ap, arg);
  const bool fits = collect(arg, ap, argv, kMaxExecArgs);
  char* const* envp = fits ? va_arg(ap, char* const*) : nullptr;
  va_end(ap);
  if (!fits) {
    errno = E2BIG;
    return -1;
  }
  return execve(path, argv, envp);
}
