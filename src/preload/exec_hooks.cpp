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

#include <cstdarg>
#include <cstring>
#include <string>
#include <vector>

#include "handoff.hpp"
#include "hook.hpp"
#include "libc.hpp"

using namespace rdmakit::preload;  // NOLINT(google-build-using-namespace)

namespace {

constexpr size_t kMaxExecArgs = 4096;  // execl* arguments collected

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

// execl's arguments, up to the terminating null pointer.
std::vector<char*> collect(const char* arg0, va_list ap) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(arg0));  // NOLINT: exec's own signature
  while (argv.back() != nullptr && argv.size() < kMaxExecArgs) {
    argv.push_back(va_arg(ap, char*));
  }
  if (argv.back() != nullptr) argv.push_back(nullptr);
  return argv;
}

}  // namespace

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  before_exec(path, envp);
  return real().execve(path, argv, envp);
}

EXPORT int execv(const char* path, char* const argv[]) {
  before_exec(path, environ);
  return real().execv(path, argv);
}

EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  before_exec(resolve(file), envp);
  return real().execvpe(file, argv, envp);
}

EXPORT int execvp(const char* file, char* const argv[]) {
  before_exec(resolve(file), environ);
  return real().execvp(file, argv);
}

EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  before_exec("", envp);
  return real().fexecve(fd, argv, envp);
}

EXPORT int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = collect(arg, ap);
  va_end(ap);
  return execv(path, argv.data());
}

EXPORT int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = collect(arg, ap);
  va_end(ap);
  return execvp(file, argv.data());
}

EXPORT int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char*> argv = collect(arg, ap);
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  return execve(path, argv.data(), envp);
}
