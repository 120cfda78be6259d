#include "providers/shm/shm_peer_policy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "core/log.hpp"
#include "rdmakit/error.hpp"

namespace rdmakit::shm {
namespace {

uid_t parse_uid(const std::string& item) {
  if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) {
    errno = 0;
    const unsigned long long v = std::strtoull(item.c_str(), nullptr, 10);
    // (uid_t)-1 is no user; a larger number must not wrap to root.
    if (errno == 0 && v < 0xffffffffull) return static_cast<uid_t>(v);
  }
  passwd pw{};
  passwd* found = nullptr;
  char buf[4096];
  if (::getpwnam_r(item.c_str(), &pw, buf, sizeof buf, &found) != 0 || found == nullptr) {
    throw Error("open", "shm", "", EINVAL,
                fmt::format("RDMAKIT_SHM_ALLOW_UIDS names '{}', which is neither a uid "
                            "nor a user of this host",
                            item));
  }
  return found->pw_uid;
}

}  // namespace

PeerPolicy::PeerPolicy(const ShmContextOptions& options)
    : self_(::geteuid()),
      allowed_(options.allowed_uids.begin(), options.allowed_uids.end()),
      any_(options.allow_any_uid) {
  if (const char* env = std::getenv("RDMAKIT_SHM_ALLOW_UIDS"); env != nullptr && *env) {
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t comma = std::min(list.find(',', start), list.size());
      const std::string item = list.substr(start, comma - start);
      if (item == "any") {
        any_ = true;
      } else if (!item.empty()) {
        allowed_.push_back(parse_uid(item));
      }
      start = comma + 1;
    }
  }
  if (any_ || !allowed_.empty()) {
    core::log().info(
        "shm: peers of other users admitted: {}",
        any_ ? std::string("any uid") : fmt::format("uids {}", fmt::join(allowed_, ",")));
  }
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (yama >> scope) ptrace_restricted_ = scope >= 1;
}

bool PeerPolicy::admits(uid_t uid) const noexcept {
  return uid == self_ || any_ ||
         std::find(allowed_.begin(), allowed_.end(), uid) != allowed_.end();
}

std::string PeerPolicy::refusal(uid_t uid, pid_t pid, const char* role) const {
  return fmt::format(
      "the {} is pid {} of uid {}, and we run as uid {}: processes of another user are "
      "refused unless admitted (ContextOptions::shm.allowed_uids or "
      "RDMAKIT_SHM_ALLOW_UIDS={})",
      role, pid, uid, self_, uid);
}

}  // namespace rdmakit::shm
