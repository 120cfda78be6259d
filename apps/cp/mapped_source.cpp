#include "mapped_source.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace rdmakit::cp {

namespace {

// The guard of the calling thread's guarded_read(), if one runs.
thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous {};
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not a guarded read: what would have happened without us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // the faulting access repeats and ends the process
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

std::shared_ptr<MappedSource> MappedSource::map(Context& context, int fd, uint64_t size,
                                                std::string* why) {
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  std::shared_ptr<MappedSource> m(new MappedSource(static_cast<std::byte*>(p), size));
  try {
    m->mr_ = context.register_memory(p, size, 0);
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
  return m;
}

MappedSource::~MappedSource() {
  mr_.reset();  // deregistered before the pages go
  ::munmap(base_, size_);
}

bool guarded_read(const std::function<void()>& read) {
  std::call_once(g_installed, install);
  sigjmp_buf jump;
  // Saves the signal mask, so that SIGBUS is not left blocked after a jump.
  if (sigsetjmp(jump, 1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &jump;
  read();
  t_guard = nullptr;
  return true;
}

}  // namespace rdmakit::cp
