#include "log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>

namespace rdmakit::session::detail {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("rdmakit.session")) return existing;
    auto made = std::make_shared<spdlog::logger>(
        "rdmakit.session", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    // Registered, so that spdlog::set_level() in the application applies to it
    // as to its own loggers (it starts at the registry's level).
    spdlog::initialize_logger(made);
    made->set_pattern("[rdmakit %L %P] %v");
    if (const char* level = std::getenv("RDMAKIT_LOG")) {
      made->set_level(spdlog::level::from_str(level));
    }
    return made;
  }();
  return *logger;
}

}  // namespace rdmakit::session::detail
