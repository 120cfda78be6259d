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
    // Quiet by default (warnings and errors), unless RDMAKIT_LOG says
    // otherwise or the application chose a level of its own before (the
    // registry's level is no longer spdlog's default, info).
    if (const char* level = std::getenv("RDMAKIT_LOG");
        level != nullptr && *level != '\0') {
      made->set_level(spdlog::level::from_str(level));
    } else if (spdlog::get_level() == spdlog::level::info) {
      made->set_level(spdlog::level::warn);
    }
    return made;
  }();
  return *logger;
}

}  // namespace rdmakit::session::detail
