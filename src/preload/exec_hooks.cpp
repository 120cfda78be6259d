// The exec family (docs/preload.md, "Process shapes"). A new image that
// loads this library takes its connections over itself; one that will not
// (its environment drops LD_PRELOAD, as systemd-socket-activate's and
// `env -i`'s do, or the kernel ignores LD_PRELOAD for a setuid or
// file-capability program) gets them settled first: a connection no process
// has used stays on kernel TCP with its client told at once, another
// process's becomes a relay socket. Otherwise the client would wait out its
// rendezvous budget for an answer no one gives, and a dormant relay would
// never start.
#include <alloca.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fd_place.hpp"
#include "handoff.hpp"
#include "hook.hpp"
#include "libc.hpp"
#include "process.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

// The environment's value of `name` (NAME=), or null.
const char* env_value(char* const envp[], const char* name) {
  if (envp == nullptr) return nullptr;
  const size_t n = std::strlen(name);
  for (char* const* e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  }
  return nullptr;
}

bool preloaded(char* const envp[]) {
  const char* v = env_value(envp, "LD_PRELOAD");
  return v != nullptr && std::strstr(v, "librdmakit-preload") != nullptr;
}

// systemd's socket-activation protocol hands LISTEN_FDS descriptors from 3.
int handed_fds(char* const envp[]) {
  const char* v = env_value(envp, "LISTEN_FDS");
  if (v == nullptr) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n > 0 && n < 4096 ? static_cast<int>(n) : 0;
}

// Whether the kernel runs path in secure mode (the loader then ignores
// LD_PRELOAD).
bool secure_program(const char* path) {
  struct stat st {};
  if (path == nullptr || *path == '\0' || stat(path, &st) != 0) return false;
  if ((st.st_mode & (S_ISUID | S_ISGID)) != 0) return true;
  return getxattr(path, "security.capability", nullptr, 0) > 0;
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

// Before the exec: connections the new image will not carry are settled,
// and the descriptor limit goes back to the application's (the new image
// makes its own room if it loads the library). after_failed_exec() undoes
// the limit when the exec returns.
void before_exec(const char* program, char* const envp[]) {
  if (!preloaded(envp)) {
    settle_for_plain_exec(
        "passed across exec to a program whose environment has no LD_PRELOAD",
        handed_fds(envp));
  } else if (secure_program(program)) {
    settle_for_plain_exec(
        "passed across exec to a setuid, setgid or file-capability program (no "
        "LD_PRELOAD)",
        handed_fds(envp));
  }
  restore_app_fd_limit();
}

int after_failed_exec(int r) {
  const int saved = errno;
  reserve_fd_room(false);
  errno = saved;
  return r;
}

// execl's arguments, counted, then copied into argv (room for them and the
// terminating null pointer, on the caller's stack).
size_t count_args(const char* arg0, va_list ap) {
  size_t n = 1;
  if (arg0 == nullptr) return n;
  va_list copy;
  va_copy(copy, ap);
  while (va_arg(copy, char*) != nullptr) ++n;
  va_end(copy);
  return n + 1;
}

void copy_args(const char* arg0, va_list ap, char** argv) {
  size_t n = 0;
  argv[n++] = const_cast<char*>(arg0);  // NOLINT: exec's own signature
  while (argv[n - 1] != nullptr) argv[n++] = va_arg(ap, char*);
}

}  // namespace

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  if (vfork_child()) return real().execve(path, argv, envp);
  before_exec(path, envp);
  return after_failed_exec(real().execve(path, argv, envp));
}

EXPORT int execv(const char* path, char* const argv[]) {
  if (vfork_child()) return real().execv(path, argv);
  before_exec(path, environ);
  return after_failed_exec(real().execv(path, argv));
}

EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  if (vfork_child()) return real().execvpe(file, argv, envp);
  before_exec(resolve(file).c_str(), envp);
  return after_failed_exec(real().execvpe(file, argv, envp));
}

EXPORT int execvp(const char* file, char* const argv[]) {
  if (vfork_child()) return real().execvp(file, argv);
  before_exec(resolve(file).c_str(), environ);
  return after_failed_exec(real().execvp(file, argv));
}

EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  if (vfork_child()) return real().fexecve(fd, argv, envp);
  before_exec(nullptr, envp);
  return after_failed_exec(real().fexecve(fd, argv, envp));
}

// The execl family: the arguments on the stack, as glibc's own.
#define RDMAKIT_EXECL_ARGS(arg)                                              \
  va_list ap;                                                                \
  va_start(ap, arg);                                                         \
  const size_t n = count_args(arg, ap);                                      \
  auto** argv = static_cast<char**>(alloca(n * sizeof(char*))); /* NOLINT */ \
  copy_args(arg, ap, argv)

EXPORT int execl(const char* path, const char* arg, ...) {
  RDMAKIT_EXECL_ARGS(arg);
  va_end(ap);
  return execv(path, argv);
}

EXPORT int execlp(const char* file, const char* arg, ...) {
  RDMAKIT_EXECL_ARGS(arg);
  va_end(ap);
  return execvp(file, argv);
}

EXPORT int execle(const char* path, const char* arg, ...) {
  RDMAKIT_EXECL_ARGS(arg);
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  return execve(path, argv, envp);
}
