#pragma once
// The session layer's logger: stderr, never stdout (applications print their
// output there). Its level is the application's spdlog level (default info)
// unless RDMAKIT_LOG (trace|debug|info|warn|error|off) sets it, as for the
// core's logger. Control path only.
#include <spdlog/spdlog.h>

namespace rdmakit::session::detail {
spdlog::logger& log();
}  // namespace rdmakit::session::detail
