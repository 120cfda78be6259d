#include "providers/verbs/verbs_objects.hpp"

#include <cstring>

#include "core/log.hpp"

namespace rdmakit::verbs {

void log_release_failure(const char* verb, int err) noexcept {
  try {
    core::log().warn("verbs: {} failed while releasing: {}", verb, std::strerror(err));
  } catch (...) {
    // Logging must not throw out of a destructor.
  }
}

}  // namespace rdmakit::verbs
