#include "core/fd.hpp"

#include <unistd.h>

namespace rdmakit::core {

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

}  // namespace rdmakit::core
