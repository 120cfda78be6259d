#pragma once
// Who may be a peer of an shm context: processes of our own uid, plus the
// uids the application or RDMAKIT_SHM_ALLOW_UIDS admits. Identity is the
// kernel's (SO_PEERCRED), never what a peer says.
#include <sys/types.h>

#include <string>
#include <vector>

#include "rdmakit/context.hpp"

namespace rdmakit::shm {

class PeerPolicy {
 public:
  // Reads options and RDMAKIT_SHM_ALLOW_UIDS (uids or user names separated
  // by commas, or "any"); throws Error on a name that is no user.
  explicit PeerPolicy(const ShmContextOptions& options);

  uid_t self() const noexcept { return self_; }
  bool admits(uid_t uid) const noexcept;
  // Why a peer of `uid` was refused and how to admit it, for errors.
  std::string refusal(uid_t uid, pid_t pid, const char* role) const;
  // Yama's ptrace_scope is at least 1: process_vm_* between our processes
  // may be refused, so SEND payloads travel through a socket instead.
  bool ptrace_restricted() const noexcept { return ptrace_restricted_; }

 private:
  uid_t self_;
  std::vector<uid_t> allowed_;
  bool any_ = false;
  bool ptrace_restricted_ = false;
};

}  // namespace rdmakit::shm
