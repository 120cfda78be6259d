#pragma once
// Control-path error: thrown by setup calls (open, register, connect, ...),
// never by the data path. Carries what failed, on which provider, with which
// peer, and the system errno.
#include <stdexcept>
#include <string>

#include "rdmakit/export.hpp"

namespace rdmakit {

class RDMAKIT_API Error : public std::runtime_error {
 public:
  Error(std::string operation, std::string provider, std::string peer, int sys_errno,
        const std::string& detail);

  const std::string& operation() const noexcept { return operation_; }
  const std::string& provider() const noexcept { return provider_; }
  const std::string& peer() const noexcept { return peer_; }
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  std::string operation_;
  std::string provider_;
  std::string peer_;
  int sys_errno_;
};

}  // namespace rdmakit
