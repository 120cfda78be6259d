#include "core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace rdmakit::core {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto made = spdlog::stderr_logger_mt("rdmakit");
    made->set_pattern("[rdmakit %L %P] %v");
    const char* level = std::getenv("RDMAKIT_LOG");
    made->set_level(level != nullptr ? spdlog::level::from_str(level)
                                     : spdlog::level::info);
    return made;
  }();
  return *logger;
}

}  // namespace rdmakit::core
