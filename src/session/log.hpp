#pragma once
// The session layer's logger: stderr, never stdout (applications print their
// output there). Its level is warn (warnings and errors only) unless
// RDMAKIT_LOG (trace|debug|info|warn|error|off) sets it, as for the core's
// logger, or the application set a global spdlog level other than spdlog's
// default before the first log line (spdlog::set_level also applies to it
// later, as it is registered). Control path only.
#include <spdlog/spdlog.h>

namespace rdmakit::session::detail {
spdlog::logger& log();
}  // namespace rdmakit::session::detail
