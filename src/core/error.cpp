#include "rdmakit/error.hpp"

#include <fmt/format.h>

#include <cstring>

namespace rdmakit {
namespace {

std::string format_error(const std::string& operation, const std::string& provider,
                         const std::string& peer, int sys_errno,
                         const std::string& detail) {
  std::string text = fmt::format("{} failed on provider {}", operation, provider);
  if (!peer.empty()) text += fmt::format(" (peer {})", peer);
  if (!detail.empty()) text += ": " + detail;
  if (sys_errno != 0) {
    const char* name = strerrorname_np(sys_errno);
    text += fmt::format(" [{}: {}]", name != nullptr ? name : "errno",
                        std::strerror(sys_errno));
  }
  return text;
}

}  // namespace

Error::Error(std::string operation, std::string provider, std::string peer, int sys_errno,
             const std::string& detail)
    : std::runtime_error(format_error(operation, provider, peer, sys_errno, detail)),
      operation_(std::move(operation)),
      provider_(std::move(provider)),
      peer_(std::move(peer)),
      sys_errno_(sys_errno) {}

}  // namespace rdmakit
