#include "core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace rdmakit::core {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto made = spdlog::stderr_logger_mt("rdmakit");
    made->set_pattern("[rdmakit %L %P] %v");
    // Quiet by default: warnings and errors only (docs: "Logging").
    const char* level = std::getenv("RDMAKIT_LOG");
    made->set_level(level != nullptr && *level != '\0' ? spdlog::level::from_str(level)
                                                       : spdlog::level::warn);
    return made;
  }();
  return *logger;
}

}  // namespace rdmakit::core
