#include "report.hpp"

#include <cerrno>
#include <cstdio>

namespace rdmakit::cp {

const char* failure_name(Failure f) noexcept {
  switch (f) {
    case Failure::kNone: return "ok";
    case Failure::kUsage: return "usage";
    case Failure::kFile: return "file";
    case Failure::kVerify: return "verify";
    case Failure::kRefused: return "refused";
    case Failure::kPeer: return "peer";
  }
  return "?";
}

Failure classify_errno(int err) noexcept {
  switch (err) {
    case EXDEV:  // openat2 RESOLVE_BENEATH: the path leaves the root
      return Failure::kRefused;
    default: return Failure::kFile;
  }
}

void Report::error(Failure kind, std::string path, std::string reason) {
  std::lock_guard lock(mu_);
  if (kind > worst_) worst_ = kind;
  std::fprintf(stderr, "rdmakit-cp: %s%s%s\n", path.c_str(), path.empty() ? "" : ": ",
               reason.c_str());
  errors_.push_back({kind, std::move(path), std::move(reason)});
}

void Report::item(const std::string& line, const std::string& name) {
  if (!itemize_ && !names_) return;
  std::lock_guard lock(mu_);
  std::fprintf(stdout, "%s\n", itemize_ ? line.c_str() : name.c_str());
}

std::vector<FileError> Report::errors() const {
  std::lock_guard lock(mu_);
  return errors_;
}

Failure Report::worst() const {
  std::lock_guard lock(mu_);
  return worst_;
}

}  // namespace rdmakit::cp
